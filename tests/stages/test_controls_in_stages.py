"""The controls wired into the stages, on a real Redis: ingest's limits and moderation, dispatch's
overload bound, render's moderation of the reply (docs/controls.md). What the stages produce goes
through the producer seam (a recorder stands in for the broker; the whole pipeline with two workers
is tests/integration/test_controls.py)."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import REGISTRY

from pipeline.records import InboundMessage, OutboundMessage, Sender, SessionCommand, SessionEventRecord, now_ms
from pipeline.runtime import reply_policy
from pipeline.segments.context import Capabilities
from pipeline.session import SessionClient, StaticPoolProvisioner
from pipeline.settings import BotConfig, Settings
from pipeline.stages.dispatch import DispatchStage
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage
from pipeline.stages.streams import StreamRegistry
from pipeline.stages.tools import ImTools
from pipeline.stages.work import run_remaining
from pipeline.state import State, TurnRecord
from pipeline.topics import SESSION_INPUT

from .test_ingest_admit import Recorder as AdmitRecorder
from .test_ingest_admit import run
from .turns import Recorder, round_trips, running_turn


class InboundRecorder(AdmitRecorder):
    def notices(self) -> list[str]:
        out = [OutboundMessage.model_validate_json(v) for t, _, v in self.records if t.startswith("im.outbound.")]
        return ["".join(getattr(s.data, "text", "") for s in m.segments) for m in out]


def bot(**controls: Any) -> BotConfig:
    return BotConfig.model_validate(
        {"platform": "console", "bot_id": "demo", "self_id": "bot", "language": "en", "admins": ["boss"], **controls}
    )


def ingest(redis_url: str, prefix: str, config: BotConfig) -> tuple[IngestStage, InboundRecorder]:
    settings = Settings(redis_prefix=prefix, bots=[config])
    recorder = InboundRecorder()
    stage = IngestStage(
        settings, State.connect(redis_url, prefix), Outputs(recorder), Notifier(settings), lambda b, m, w: None
    )
    return stage, recorder


def msg(n: int, text: str, *, user: str = "u1", chat: str = "g", mention: bool = True) -> InboundMessage:
    return InboundMessage(
        platform="console",
        bot_id="demo",
        chat_id=chat,
        chat_type="group",
        sender=Sender(user_id=user, name=user),
        message_id=f"m{n}",
        text=text,
        mentions_bot=mention,
        conversation_key=f"console:demo:{chat}",
        trace_id=f"t{n}",
        hops={"ingress": now_ms()},
    )


async def window(stage: IngestStage, chat: str = "g") -> list[str]:
    return [e.message_id for e in await stage.state.conversations.context(f"console:demo:{chat}", 20)]


async def test_over_the_limit_dropped_or_held_in_the_window_commands_and_admins_go_through(
    redis_url: str, redis_prefix: str
) -> None:
    limits = {"user_turns": {"count": 1, "per_seconds": 3600}}
    for over_limit, kept in (("drop", ["m1"]), ("hold", ["m1", "m2", "m3"])):
        prefix = f"{redis_prefix}{over_limit}:"
        stage, recorder = ingest(redis_url, prefix, bot(limits={**limits, "over_limit": over_limit}))
        produced = await run(stage, recorder, [msg(1, "@bot one"), msg(2, "@bot two"), msg(3, "@bot three")])
        assert produced == [True, True, False]  # a turn, the window's one notice, nothing
        assert [t.inbound_ids for t in recorder.turns()] == [["m1"]]
        assert recorder.notices() == ["Too many requests right now; please wait a while before asking again."]
        assert sorted(await window(stage)) == kept
        # Over the limit still: /stop is a command, and the bot's admin is exempt.
        assert await run(stage, recorder, [msg(4, "/stop"), msg(5, "@bot boss here", user="boss")]) == [True, True]
        assert [t.kind for t in recorder.turns()] == ["user_turn", "interrupt", "user_turn"]
        # The notice's message is marked seen: a replay of it produces nothing again.
        assert await run(stage, recorder, [msg(2, "@bot two")]) == [False]
        await stage.state.redis.aclose()


def rate_limited(outcome: str) -> float:
    labels = {"platform": "console", "bot": "demo", "scope": "user", "outcome": outcome}
    return REGISTRY.get_sample_value("switchboard_rate_limited_total", labels) or 0.0


def moderated(outcome: str) -> float:
    labels = {"platform": "console", "bot": "demo", "direction": "inbound", "outcome": outcome, "reason": "list"}
    return REGISTRY.get_sample_value("switchboard_moderation_total", labels) or 0.0


async def test_a_replayed_batch_counts_no_control_decision_twice(redis_url: str, redis_prefix: str) -> None:
    """The limits' and moderation's metrics count each message once: a replay after a crash (its
    messages seen, or its limits answered before the crash by another worker) counts nothing more,
    and still gets its one notice under the same id."""
    config = bot(
        limits={"user_turns": {"count": 1, "per_seconds": 3600}},
        moderation={"words": ["spam"], "inbound": "notice"},
    )
    crashed, _ = ingest(redis_url, redis_prefix, config)
    stage, recorder = ingest(redis_url, redis_prefix, config)
    before = {"noticed": rate_limited("noticed"), "limited": rate_limited("limited"), "mod": moderated("noticed")}
    batch = [msg(1, "@bot one"), msg(2, "@bot two"), msg(3, "@bot three"), msg(4, "@bot spam")]
    # A worker admits the batch and dies before any of its work ran (no turn, no notice, no mark).
    await crashed.admit(batch)
    # Its partition's new owner gets the same records: the limits give their first answers again.
    assert await run(stage, recorder, batch) == [True, True, False, True]
    assert len(recorder.notices()) == 2  # the limit's one notice, the moderation notice
    # And the same batch once more, now that all of it is done (the turn produces again: dispatch,
    # not here, marks a turn's message seen, and drops the repeat by its stable id).
    assert await run(stage, recorder, batch) == [True, False, False, False]
    assert len(recorder.notices()) == 2
    assert rate_limited("noticed") - before["noticed"] == 1
    assert rate_limited("limited") - before["limited"] == 1
    assert moderated("noticed") - before["mod"] == 2  # decided by each worker: pure, no state to tell
    await crashed.state.redis.aclose()
    await stage.state.redis.aclose()


async def test_a_moderated_trigger_starts_no_turn_and_chatter_stays_out_of_the_window(
    redis_url: str, redis_prefix: str
) -> None:
    before = REGISTRY.get_sample_value(
        "switchboard_moderation_total",
        {"platform": "console", "bot": "demo", "direction": "inbound", "outcome": "dropped", "reason": "list"},
    )
    stage, recorder = ingest(redis_url, redis_prefix, bot(moderation={"words": ["spam"], "inbound": "drop"}))
    batch = [msg(1, "@bot buy SPAM"), msg(2, "spam spam", mention=False), msg(3, "hello", mention=False)]
    assert await run(stage, recorder, batch) == [False, False, False]
    assert recorder.records == []  # no turn, and silently: the bot drops without a notice
    assert await window(stage) == ["m3"]
    after = REGISTRY.get_sample_value(
        "switchboard_moderation_total",
        {"platform": "console", "bot": "demo", "direction": "inbound", "outcome": "dropped", "reason": "list"},
    )
    assert (after or 0) - (before or 0) == 1  # the trigger; chatter kept out of the window is no decision
    await stage.state.redis.aclose()


async def test_a_message_whose_turn_did_not_start_in_time_gets_the_overloaded_notice(
    redis_url: str, redis_prefix: str
) -> None:
    settings = Settings(redis_prefix=redis_prefix, bots=[bot(overload={"max_wait_seconds": 60})])
    state = State.connect(redis_url, redis_prefix)
    recorder = Recorder()
    outputs = Outputs(recorder)
    client = SessionClient(api_key="unused", base_url="http://127.0.0.1:9")  # a send would fail: none is made
    stage = DispatchStage(
        settings,
        state,
        client,
        StaticPoolProvisioner(["s1"]),
        StreamRegistry(state.streams, client, outputs),
        outputs,
        Notifier(settings),
    )
    command = SessionCommand(
        kind="user_turn",
        conversation_key="console:demo:g",
        platform="console",
        bot_id="demo",
        chat_id="g",
        chat_type="group",
        events=[{"type": "user.message", "id": "msg-old", "content": [{"type": "text", "text": "old question"}]}],
        inbound_ids=["m-old"],
        reply_to_message_id="m-old",
        trace_id="t-old",
        hops={"ingress": now_ms() - 61_000},
    )
    try:
        await stage.handle(command, 0)
        await stage.handle(command, 0)  # a replay: the same notice, under the same id
    finally:
        await client.aclose()
        await state.redis.aclose()
    notices = recorder.replies()
    assert [n.segments[0].data.text for n in notices] == [  # type: ignore[union-attr]
        "Sorry, I'm too busy to answer that now. Please try again later."
    ] * 2
    assert notices[0].outbound_id == notices[1].outbound_id and notices[0].reply_to_message_id == "m-old"
    assert [t for t, _ in recorder.records if t == SESSION_INPUT] == []


async def moderated_render(
    redis_url: str, prefix: str, policy: str, events: list[dict[str, Any]]
) -> tuple[list[str], list[SessionCommand]]:
    """`events` of one running turn through render, for a bot whose outbound moderation `policy`
    (block, redact) hits "secret plan": what the chat is sent (kind:text), and the tool results
    sent back to the session."""
    config = bot(moderation={"patterns": [r"secret\s+plan"], "outbound": policy}, progress=True)
    settings = Settings(redis_prefix=f"{prefix}{policy}:", bots=[config])
    state = State.connect(redis_url, settings.redis_prefix)
    recorder = Recorder()
    render = RenderStage(
        settings,
        state,
        Outputs(recorder),
        Notifier(settings),
        {("console", "demo"): reply_policy(config, settings)},
        {"console": Capabilities()},
        ImTools(settings, state.conversations),
    )
    turn = TurnRecord(trace_id="t", platform="console", bot_id="demo", chat_id="g", chat_type="group", starter_id="u1")
    await running_turn(state, "console:demo:g", turn, "m1")
    try:
        for event in events:
            await render.handle(SessionEventRecord(conversation_key="console:demo:g", session_id="s1", event=event))
    finally:
        await state.redis.aclose()
    shown = [f"{m.kind}:" + "".join(getattr(s.data, "text", "") for s in m.segments) for m in recorder.replies()]
    results = [SessionCommand.model_validate_json(v) for t, v in recorder.records if t == SESSION_INPUT]
    return shown, results


async def test_the_reply_is_moderated_after_validation_blocked_or_redacted(redis_url: str, redis_prefix: str) -> None:
    reply = {"segments": [{"type": "text", "data": {"text": "the Secret  Plan is ready"}}]}
    events: list[dict[str, Any]] = [
        {"type": "agent.message", "id": "e1", "content": [{"type": "text", "text": json.dumps(reply)}]},
        {"type": "session.status_idle", "id": "e2", "stop_reason": {"type": "end_turn"}},
    ]
    blocked, _ = await moderated_render(redis_url, redis_prefix, "block", events)
    redacted, _ = await moderated_render(redis_url, redis_prefix, "redact", events)
    assert blocked == ["notice:Sorry, this reply was withheld by the chat's content rules."]
    assert redacted == ["reply:the *** is ready"]


async def test_progress_im_tool_messages_and_quoted_tool_input_are_moderated_too(
    redis_url: str, redis_prefix: str
) -> None:
    """Everything the agent writes that reaches the chat passes the lists, not only the reply: a
    progress message (blocked: left out), an `im_send_message` (blocked: not sent, and the agent
    told so), a confirmation prompt's quote of the tool's input (blocked: one `***`)."""

    def outbound_moderated(outcome: str) -> float:
        labels = {"platform": "console", "bot": "demo", "direction": "outbound", "outcome": outcome, "reason": "list"}
        return REGISTRY.get_sample_value("switchboard_moderation_total", labels) or 0.0

    progress: list[dict[str, Any]] = [
        {"type": "agent.message", "id": "p1", "content": [{"type": "text", "text": "checking the secret plan now"}]},
        {"type": "agent.tool_use", "id": "p2", "name": "web_search", "input": {}, "evaluated_permission": "allow"},
    ]
    im_tool: list[dict[str, Any]] = [
        {"type": "agent.custom_tool_use", "id": "c1", "name": "im_send_message", "input": {"text": "secret plan: go"}},
        {"type": "session.status_idle", "id": "c2", "stop_reason": {"type": "requires_action", "event_ids": ["c1"]}},
    ]
    confirmation: list[dict[str, Any]] = [
        {
            "type": "agent.tool_use",
            "id": "a1",
            "name": "bash",
            "input": {"command": "echo secret plan"},
            "evaluated_permission": "ask",
        },
        {"type": "session.status_idle", "id": "a2", "stop_reason": {"type": "requires_action", "event_ids": ["a1"]}},
    ]
    before = {o: outbound_moderated(o) for o in ("blocked", "redacted")}
    shown: dict[str, list[str]] = {}
    results: dict[str, list[str]] = {}
    for policy in ("block", "redact"):
        for name, events in (("progress", progress), ("im_tool", im_tool), ("confirmation", confirmation)):
            key = f"{policy}/{name}"
            shown[key], commands = await moderated_render(redis_url, f"{redis_prefix}{name}:", policy, events)
            results[key] = [e["content"][0]["text"] for c in commands for e in c.events]
    assert shown["block/progress"] == [] and shown["redact/progress"] == ["progress:checking the *** now"]
    assert shown["block/im_tool"] == [] and results["block/im_tool"] == [
        "Not sent: the message was withheld by the chat's content rules."
    ]
    assert shown["redact/im_tool"] == ["progress:***: go"] and results["redact/im_tool"] == ["sent"]
    (blocked_prompt,) = shown["block/confirmation"]
    (redacted_prompt,) = shown["redact/confirmation"]
    assert "secret" not in blocked_prompt.lower() and '"command"' not in blocked_prompt and "***" in blocked_prompt
    assert '{"command": "echo ***"}' in redacted_prompt
    assert outbound_moderated("blocked") - before["blocked"] == 3
    assert outbound_moderated("redacted") - before["redacted"] == 3


async def test_a_flooding_user_cannot_push_the_others_out_of_the_context_window(
    redis_url: str, redis_prefix: str
) -> None:
    limits = {"user_messages": {"count": 3, "per_seconds": 3600}, "chat_messages": {"count": 8, "per_seconds": 3600}}
    stage, recorder = ingest(redis_url, redis_prefix, bot(limits=limits))
    unkept = {"platform": "console", "bot": "demo", "scope": "context", "outcome": "unkept"}
    before = REGISTRY.get_sample_value("switchboard_rate_limited_total", unkept) or 0.0
    flood = [msg(n, f"flood {n}", user="flooder", mention=False) for n in range(20)]  # one batch: started
    await run(stage, recorder, flood)
    others = [msg(100 + n, f"hi {n}", user=f"u{n}", mention=False) for n in range(7)]  # small batches
    for one in others:
        await run(stage, recorder, [one])
    await run(stage, recorder, [msg(200, "@bot what was said?", user="asker")])
    kept = await window(stage)
    assert sorted(kept) == ["m0", "m1", "m100", "m101", "m102", "m103", "m104", "m2"]  # the chat's 8
    assert (REGISTRY.get_sample_value("switchboard_rate_limited_total", unkept) or 0.0) - before == 17 + 2 + 1
    # The turn still starts (its words are in the turn itself); only the window was full.
    ((turn,),) = [[t for t in recorder.turns() if t.inbound_ids == ["m200"]]]
    assert turn.kind == "user_turn"
    await stage.state.redis.aclose()


async def test_the_limits_cost_one_script_call_per_batch_with_triggers_and_none_without(
    redis_url: str, redis_prefix: str
) -> None:
    cases = {
        "none": {},
        "turns": {"user_turns": {"count": 100, "per_seconds": 60}, "chat_turns": {"count": 100, "per_seconds": 60}},
        "messages": {"user_messages": {"count": 100, "per_seconds": 60}},
    }
    calls: dict[str, float] = {}
    for name, limits in cases.items():
        stage, _ = ingest(redis_url, f"{redis_prefix}{name}:", bot(limits=limits))
        # Once first: a script's first call on a server without it loads it (two more round trips),
        # which depends on which test ran before on the same Redis.
        warm = [msg(50, "chatter", user="w", mention=False), msg(51, "@bot warm", chat="g9")]
        for work in await stage.admit(warm):
            await run_remaining(work)
        batch = [msg(n, f"chatter {n}", user=f"u{n}", mention=False) for n in range(5)]
        batch += [msg(10, "@bot one", chat="g2"), msg(11, "@bot two", user="u2", chat="g3")]
        before = round_trips()
        works = await stage.admit(batch)
        calls[name] = round_trips() - before
        for work in works:
            await run_remaining(work)
        await stage.state.redis.aclose()
    # The admission itself is one script call; the turn limits one more (for both triggers); the
    # message limits ride in the admission's call.
    assert calls == {"none": 1, "turns": 2, "messages": 1}
