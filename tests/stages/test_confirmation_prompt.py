"""A tool confirmation prompt says what would run: the tool's name and its input, shortened, with
every configured secret taken out (the leak corpus on this path is in `test_leak_paths.py`).
Against a real Redis; what render produces goes to a recorder at the producer seam."""

from __future__ import annotations

import json
from typing import Any

from pipeline.records import SessionEventRecord
from pipeline.runtime import leak_scanner, reply_policy
from pipeline.settings import BotConfig, Settings
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage
from pipeline.stages.tools import ImTools
from pipeline.state import State, TurnRecord

from .turns import Recorder, running_turn

SECRET = "tg-Webhook-Secret-5521"


def render_stage(redis_url: str, prefix: str, *, language: str = "en") -> tuple[RenderStage, Recorder]:
    bots = [
        BotConfig(platform="console", bot_id="demo", language=language),
        BotConfig(platform="telegram", bot_id="tg1", credentials={"token": "1:AA", "webhook_secret": SECRET}),
    ]
    s = Settings(redis_prefix=prefix, bots=bots)
    state = State.connect(redis_url, s.redis_prefix)
    scanner = leak_scanner(s)
    recorder = Recorder()
    stage = RenderStage(
        s,
        state,
        Outputs(recorder),
        Notifier(s),
        {(b.platform, b.bot_id): reply_policy(b, s, scanner) for b in s.bots},
        {},
        ImTools(s, state.conversations),
    )
    return stage, recorder


def record(conversation: str, event: dict[str, Any]) -> SessionEventRecord:
    return SessionEventRecord(conversation_key=conversation, session_id="s1", event=event)


async def prompt_for(stage: RenderStage, recorder: Recorder, chat: str, inputs: list[dict[str, Any]]) -> str:
    """The text of the prompt render sends when the agent asks to run `bash` with each input."""
    conversation = f"console:demo:{chat}"
    turn = TurnRecord(
        trace_id=f"t-{chat}",
        platform="console",
        bot_id="demo",
        chat_id=chat,
        chat_type="group",
        starter_id="alice",
        reply_to_message_id=f"in-{chat}",
    )
    await running_turn(stage.state, conversation, turn, f"m-{chat}")
    ids = [f"tool-{chat}-{n}" for n in range(len(inputs))]
    for event_id, tool_input in zip(ids, inputs, strict=True):
        await stage.handle(
            record(
                conversation,
                {
                    "type": "agent.tool_use",
                    "id": event_id,
                    "name": "bash",
                    "input": tool_input,
                    "evaluated_permission": "ask",
                },
            )
        )
    stop = {"type": "requires_action", "event_ids": ids}
    await stage.handle(record(conversation, {"type": "session.status_idle", "id": f"idle-{chat}", "stop_reason": stop}))
    [prompt] = [m for m in recorder.replies() if m.chat_id == chat]
    assert prompt.kind == "confirmation"
    [segment] = prompt.segments
    assert segment.type == "text"
    return segment.data.text


async def test_the_prompt_quotes_the_tool_and_its_input(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    try:
        text = await prompt_for(stage, recorder, "c1", [{"command": "echo step 1"}])
    finally:
        await stage.state.redis.aclose()
    assert text == (
        'The assistant wants to run the tool bash with the input {"command": "echo step 1"}. '
        "@alice may reply /allow or /deny."
    )


async def test_every_pending_call_is_quoted(redis_url: str, redis_prefix: str) -> None:
    # One /allow answers all pending calls, so the prompt shows each of them.
    stage, recorder = render_stage(redis_url, redis_prefix)
    try:
        text = await prompt_for(stage, recorder, "c2", [{"command": "echo step 1"}, {"command": "echo step 2"}])
    finally:
        await stage.state.redis.aclose()
    assert '{"command": "echo step 1"}; {"command": "echo step 2"}' in text


async def test_a_long_input_is_shortened_and_marked(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    tool_input = {"command": "cat " + "a" * 5000}
    try:
        text = await prompt_for(stage, recorder, "c3", [tool_input])
    finally:
        await stage.state.redis.aclose()
    quoted = json.dumps(tool_input)
    assert quoted[:200] + "…" in text
    assert quoted[:201] not in text
    assert len(text) < 400


async def test_a_secret_in_the_input_is_redacted_before_quoting(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix)
    try:
        text = await prompt_for(stage, recorder, "c4", [{"command": f"curl -H 'key: {SECRET}' https://x"}])
    finally:
        await stage.state.redis.aclose()
    assert SECRET not in text
    assert "curl -H 'key: [redacted]' https://x" in text


async def test_the_chinese_prompt_quotes_the_input_too(redis_url: str, redis_prefix: str) -> None:
    stage, recorder = render_stage(redis_url, redis_prefix, language="zh")
    try:
        text = await prompt_for(stage, recorder, "c5", [{"command": "echo step 1"}])
    finally:
        await stage.state.redis.aclose()
    assert '{"command": "echo step 1"}' in text and "@alice" in text
