"""Dispatch's merge, render's reading of server events, egress's backoff."""

from __future__ import annotations

import random

from pipeline.records import SessionCommand
from pipeline.session.models import AgentCustomToolUse, AgentMCPToolUse, AgentMessage, AgentToolUse
from pipeline.stages._ids import user_message_id
from pipeline.stages._turns import merge_turns, message_parts, without_messages
from pipeline.stages.egress import backoff_delay
from pipeline.stages.render import message_text, pending_from_tool_event


def turn(text: str, inbound: str, known: list[str]) -> SessionCommand:
    return SessionCommand(
        kind="user_turn",
        conversation_key="console:b:c",
        platform="console",
        bot_id="b",
        chat_id="c",
        chat_type="group",
        events=[
            {
                "type": "user.message",
                "id": user_message_id("console:b:c", [inbound]),
                "content": [{"type": "text", "text": text}],
            }
        ],
        system_text=f"context after {inbound}",
        inbound_ids=[inbound],
        known_ids=known,
        trace_id=inbound,
        hops={"ingress": float(inbound[-1])},
    )


def test_merge_keeps_order_and_derives_one_stable_id() -> None:
    merged = merge_turns([turn("a", "m1", ["u1"]), turn("b", "m2", ["u2", "u1"]), turn("c", "m3", [])])
    (event,) = merged.events
    assert [b["text"] for b in event["content"]] == ["a", "b", "c"]
    assert event["id"] == user_message_id("console:b:c", ["m1", "m2", "m3"])
    assert merged.inbound_ids == ["m1", "m2", "m3"]
    assert merged.known_ids == ["u1", "u2"]
    assert merged.system_text == "context after m3"  # the newest context wins
    assert merged.hops == {"ingress": 1.0}  # latency counts from the first message


def test_merge_keeps_each_messages_share_of_the_blocks_and_a_cut_takes_one_out() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://img.example/b.png"}}
    with_image = turn("b", "m2", ["u2"])
    with_image.events[0]["content"].append(image)
    a, c = turn("a", "m1", ["u1"]), turn("c", "m3", ["u3"])
    quoted = [t.model_copy(update={"reply_to_message_id": t.inbound_ids[0]}) for t in (a, with_image, c)]
    merged = merge_turns(quoted)
    assert merged.parts == [1, 2, 1] and merged.reply_to_message_id == "m3"
    assert merge_turns([merged, turn("d", "m4", [])]).parts == [1, 2, 1, 1]  # a flush of merged turns

    rest = without_messages(merged, [False, True, False])
    assert rest is not None
    (event,) = rest.events
    assert [b["text"] for b in event["content"]] == ["a", "c"]
    assert event["id"] == user_message_id("console:b:c", ["m1", "m3"])
    assert (rest.inbound_ids, rest.parts) == (["m1", "m3"], [1, 1])
    newest_taken = without_messages(merged, [False, False, True])
    assert newest_taken is not None
    assert newest_taken.events[0]["content"] == [{"type": "text", "text": "a"}, *with_image.events[0]["content"]]
    assert newest_taken.reply_to_message_id == "m2"  # the answer quotes the newest message it answers
    one = without_messages(merged, [True, True, False])
    assert one is not None and (one.inbound_ids, one.parts) == (["m3"], [])  # one message: no parts
    assert without_messages(merged, [True, True, True]) is None

    # A merged record from before `parts`: it cannot say whose blocks are whose, so it is not cut.
    older = merged.model_copy(update={"parts": []})
    assert message_parts(older) is None and without_messages(older, [True, False, False]) is None
    assert merge_turns([older, a]).parts == []
    assert message_parts(with_image) == [2]


def test_merge_of_one_is_itself() -> None:
    single = turn("a", "m1", [])
    assert merge_turns([single]) is single


def test_merge_is_deterministic_so_a_replay_sends_the_same_id() -> None:
    a = merge_turns([turn("a", "m1", []), turn("b", "m2", [])])
    b = merge_turns([turn("a", "m1", []), turn("b", "m2", [])])
    assert a.events == b.events


def test_message_text_joins_text_blocks_only() -> None:
    blocks = [{"type": "text", "text": '{"seg'}, {"type": "image", "source": {"type": "url", "url": "u"}}]
    event = AgentMessage.model_validate({"content": [*blocks, {"type": "text", "text": 'ments":[]}'}]})
    assert message_text(event) == '{"segments":[]}'
    assert message_text(AgentMessage()) == ""


def test_only_ask_permissions_and_custom_tools_are_pending() -> None:
    ask = pending_from_tool_event(AgentToolUse(id="e1", name="bash", evaluated_permission="ask", input={"a": 1}))
    assert ask is not None and ask.kind == "confirmation" and ask.name == "bash" and ask.input == {"a": 1}
    assert pending_from_tool_event(AgentToolUse(id="e2", name="bash", evaluated_permission="allow")) is None
    mcp = pending_from_tool_event(AgentMCPToolUse(id="e4", mcp_server_name="m", name="q", evaluated_permission="ask"))
    assert mcp is not None and mcp.kind == "confirmation"
    custom = pending_from_tool_event(AgentCustomToolUse(id="e3", name="im_send_message"))
    assert custom is not None and custom.kind == "custom_tool"
    assert pending_from_tool_event(AgentCustomToolUse(name="x")) is None  # no id: nothing to answer


def test_backoff_is_full_jitter_under_a_cap() -> None:
    rng = random.Random(3)
    delays = [backoff_delay(a, base=0.5, cap=4.0, rng=rng) for a in range(10) for _ in range(50)]
    assert all(0 <= d <= 4.0 for d in delays)
    assert max(backoff_delay(0, base=0.5, rng=rng) for _ in range(100)) <= 0.5
    assert len({round(d, 6) for d in delays}) > 400  # jittered, not fixed steps
