"""The scripted agent: reply directives, errors, tool round trips, interrupts."""

from __future__ import annotations

import asyncio
import json

import pytest

from pipeline.session import (
    NotFoundError,
    SessionClient,
    TextBlock,
    UserCustomToolResult,
    UserInterrupt,
    UserToolConfirmation,
)
from pipeline.session.models import AgentCustomToolUse, AgentToolUse, RequiresAction, SessionError, SessionUsage
from pipeline.sim import SimServer
from pipeline.sim.agent import _answer_text

from .helpers import collect_until, final_reply, last_idle, segments_text, system_message, turn, types_of, user_message


async def test_reply_shaping_directives(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    prose = final_reply(await turn(ark, sid, "say {x} [sim:invalid_json]"))
    assert "{" not in prose and "echo: say" in prose
    fenced = final_reply(await turn(ark, sid, "fence [sim:fenced_json]"))
    assert fenced.startswith("```json\n") and fenced.endswith("\n```")
    assert segments_text(fenced[len("```json\n") : -len("\n```")]) == "echo: fence"
    broken = final_reply(await turn(ark, sid, "nope [sim:uncorrectable]"))
    assert "SIM-UNCORRECTABLE" in broken
    with pytest.raises(ValueError):
        json.loads(broken)
    long_reply = final_reply(await turn(ark, sid, "pad [sim:long=500]"))
    assert len(segments_text(long_reply)) == 500
    exact = '{"segments":[{"type":"text","data":{"text":"a]b"}}]}'
    assert final_reply(await turn(ark, sid, f"ignored [sim:reply={exact}]")) == exact


async def test_deltas_directive_previews(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("stream me [sim:deltas] [sim:think=0.3]"), system_message()])
    items = await collect_until(ark, sid, after=None, deltas=True)
    from pipeline.session import Preview

    previews = [i for i in items if isinstance(i, Preview)]
    final = [i for i in items if getattr(i, "type", "") == "agent.message"][-1]
    assert previews and previews[-1].event_id == final.id  # type: ignore[union-attr]
    assert previews[-1].text == final.text  # type: ignore[union-attr]
    assert echoed[0].type == "user.message"


async def test_error_directives(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    retrying = await turn(ark, sid, "r [sim:error=retrying]")
    error = next(e for e in retrying if isinstance(e, SessionError))
    assert error.error.retry_status.type == "retrying"
    assert segments_text(final_reply(retrying)) == "echo: r"
    exhausted = await turn(ark, sid, "e [sim:error=exhausted]")
    assert last_idle(exhausted).stop_reason.type == "retries_exhausted"
    assert "agent.message" not in types_of(exhausted)
    # retries_exhausted is not termination: the session still answers.
    assert segments_text(final_reply(await turn(ark, sid, "again"))) == "echo: again"
    echoed = await ark.send(sid, [user_message("t [sim:error=terminal]"), system_message()])
    items = await collect_until(ark, sid, after=echoed[-1].id, stop_types=("session.status_terminated",))
    assert types_of(items)[-2:] == ["session.thread_status_terminated", "session.status_terminated"]


async def test_delete_directive(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    watcher = asyncio.create_task(collect_until(ark, sid, after=None, stop_types=("session.deleted",)))
    await asyncio.sleep(0.1)
    await ark.send(sid, [user_message("[sim:delete] [sim:think=0.2]"), system_message()])
    items = await watcher
    assert types_of(items)[-1] == "session.deleted"
    sim.sessions.pop(sid, None)
    with pytest.raises(NotFoundError):
        await ark.get_session(sid)


async def _until_idle(client: SessionClient, sid: str, after: str | None) -> list[object]:
    return list(await collect_until(client, sid, after=after))


async def test_confirmation_allow_and_deny(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("do it [sim:confirm_tool]"), system_message()])
    first = await _until_idle(ark, sid, echoed[-1].id)
    idle = last_idle(first)
    assert isinstance(idle.stop_reason, RequiresAction)
    tool_use = next(e for e in first if isinstance(e, AgentToolUse))
    assert tool_use.evaluated_permission == "ask" and idle.stop_reason.event_ids == [tool_use.id]
    answer = await ark.send(sid, [UserToolConfirmation(result="allow", tool_use_id=tool_use.id or "")])
    rest = await _until_idle(ark, sid, answer[-1].id)
    assert segments_text(final_reply(rest)) == "tool allowed"

    echoed = await ark.send(sid, [user_message("again [sim:confirm_tool]"), system_message()])
    idle = last_idle(await _until_idle(ark, sid, echoed[-1].id))
    assert isinstance(idle.stop_reason, RequiresAction)
    answer = await ark.send(
        sid, [UserToolConfirmation(result="deny", tool_use_id=idle.stop_reason.event_ids[0], deny_message="not now")]
    )
    assert segments_text(final_reply(await _until_idle(ark, sid, answer[-1].id))) == "tool denied: not now"


async def test_partial_answers_reidle_with_the_rest(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("q [sim:confirm_tool=2] [sim:custom_tool=lookup]"), system_message()])
    first = await _until_idle(ark, sid, echoed[-1].id)
    idle = last_idle(first)
    assert isinstance(idle.stop_reason, RequiresAction)
    ids = idle.stop_reason.event_ids
    assert len(ids) == 3
    custom = next(e for e in first if isinstance(e, AgentCustomToolUse))
    assert custom.name == "lookup" and custom.input == {"query": "q"}
    answer = await ark.send(sid, [UserToolConfirmation(result="allow", tool_use_id=ids[0])])
    second = last_idle(await _until_idle(ark, sid, answer[-1].id))
    assert isinstance(second.stop_reason, RequiresAction)
    assert second.stop_reason.event_ids == ids[1:]
    answer = await ark.send(
        sid,
        [
            UserToolConfirmation(result="deny", tool_use_id=ids[1], deny_message="no"),
            UserCustomToolResult(custom_tool_use_id=ids[2], content=[TextBlock(text="42")]),
        ],
    )
    rest = await _until_idle(ark, sid, answer[-1].id)
    assert segments_text(final_reply(rest)) == "tool allowed\ntool denied: no\ntool result: 42"


async def test_custom_tool_error_result(sim: SimServer, anthropic_client: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await anthropic_client.send(sid, [user_message("img [sim:custom_tool=draw]"), system_message()])
    idle = last_idle(await _until_idle(anthropic_client, sid, echoed[-1].id))
    assert isinstance(idle.stop_reason, RequiresAction)
    answer = await anthropic_client.send(
        sid,
        [
            UserCustomToolResult(
                custom_tool_use_id=idle.stop_reason.event_ids[0], content=[TextBlock(text="boom")], is_error=True
            )
        ],
    )
    assert segments_text(final_reply(await _until_idle(anthropic_client, sid, answer[-1].id))) == "tool error: boom"


async def test_interrupt_running_turn_ends_with_end_turn(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("slow [sim:think=5] [sim:deltas]"), system_message()])
    await asyncio.sleep(0.1)
    await ark.send(sid, [UserInterrupt()])
    items = await collect_until(ark, sid, after=echoed[-1].id, within=3)
    kinds = types_of(items)
    assert "agent.message" not in kinds
    assert kinds[-4:] == ["user.interrupt", "session.thread_status_idle", "session.usage", "session.status_idle"]
    assert last_idle(items).stop_reason.type == "end_turn"


async def test_interrupt_while_awaiting_action(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("x [sim:confirm_tool]"), system_message()])
    await _until_idle(ark, sid, echoed[-1].id)
    answer = await ark.send(sid, [UserInterrupt()])
    items = await _until_idle(ark, sid, answer[-1].id)
    assert last_idle(items).stop_reason.type == "end_turn"
    assert segments_text(final_reply(await turn(ark, sid, "next"))) == "echo: next"


async def test_interrupt_idle_session_per_profile(
    sim: SimServer, ark: SessionClient, anthropic_client: SessionClient
) -> None:
    sid = await sim.create_session()
    await ark.send(sid, [UserInterrupt()])
    history = [e async for e in ark.list(sid)]
    assert types_of(history) == ["user.interrupt", "session.error"]
    error = history[-1]
    assert isinstance(error, SessionError) and error.error.message == "no active turn to cancel"
    other = await sim.create_session()
    await anthropic_client.send(other, [UserInterrupt()])
    assert types_of([e async for e in anthropic_client.list(other)]) == ["user.interrupt"]


async def test_progress_directive(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    events = await turn(ark, sid, "p [sim:progress]")
    kinds = types_of(events)
    first_message = kinds.index("agent.message")
    assert kinds.index("agent.tool_use") > first_message
    assert kinds.count("agent.message") == 2
    assert segments_text(final_reply(events)) == "echo: p"


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        ({"result": "allow"}, "tool allowed"),
        ({"result": "deny"}, "tool denied"),
        ({"result": "deny", "deny_message": "  "}, "tool denied"),
        ({"result": "deny", "deny_message": "not now"}, "tool denied: not now"),
    ],
)
def test_a_denial_without_a_reason_has_no_dangling_colon(answer: dict[str, str], text: str) -> None:
    assert _answer_text("confirm", answer) == text


async def test_usage_directive_reports_the_chosen_token_counts(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    first = await turn(ark, sid, "count [sim:usage=input:1200,output:300,active:30]")
    usage = [e for e in first if isinstance(e, SessionUsage)][-1].usage
    assert (usage.input_tokens, usage.output_tokens) == (1200, 300)
    assert usage.active_seconds >= 30
    second = await turn(ark, sid, "more [sim:usage=input:5,output:bad,cache_read:7]")
    usage = [e for e in second if isinstance(e, SessionUsage)][-1].usage
    # Cumulative per session (P9): the second turn adds 5 input tokens, its default output count and 7 cached.
    assert usage.input_tokens == 1205 and usage.output_tokens > 300 and usage.cache_read_input_tokens == 7
