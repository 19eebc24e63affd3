"""What the worker checks for on the way out, configured at start-up: the deployment's secrets, the
warning for short ones, the bounded labels of session errors, and rejected media counted by reason."""

from __future__ import annotations

import json
import logging

import pytest
from prometheus_client import REGISTRY

from pipeline.records import OutboundMessage, SessionEventRecord
from pipeline.runtime import Runtime, deployment_secrets, reply_policy
from pipeline.segments import Capabilities, MediaChecker, MediaSettings, SafeFetcher
from pipeline.session.models import SessionError
from pipeline.settings import BotConfig, Settings
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.stages.render import RenderStage, _shortened, session_error_labels
from pipeline.stages.tools import ImTools
from pipeline.state import State, TurnRecord

from .turns import running_turn


def _settings(**extra: object) -> Settings:
    bots = [
        BotConfig(platform="onebot", bot_id="qq1", credentials={"secret": "abc12", "access_token": "ob-token-123456"}),
        BotConfig(
            platform="telegram",
            bot_id="tg1",
            credentials={"token": "123:tg-token-55", "webhook_secret": "tg-secret-8812"},
        ),
    ]
    return Settings(bots=bots, **extra)  # type: ignore[arg-type]


def test_every_secret_of_the_deployment_is_collected_with_where_it_is_configured() -> None:
    settings = _settings(
        session_api_key="sess-key-1",
        correction_api_key="corr-key-2",
        ark_access_key="AKLT-ak-3",
        ark_secret_key="ark-sk-4",
        redis_url="rediss://default:red%40is-pw@redis.internal:6380/0",
        kafka_bootstrap="SASL_SSL://svc:kafka-pw-5@k1.internal:9093,SASL_SSL://svc:kafka-pw-5@k2.internal:9093",
    )
    found = {(s.source, s.value) for s in deployment_secrets(settings)}
    assert found >= {
        ("bot onebot/qq1, credential 'secret'", "abc12"),
        ("bot onebot/qq1, credential 'access_token'", "ob-token-123456"),
        ("bot telegram/tg1, credential 'webhook_secret'", "tg-secret-8812"),
        ("setting session_api_key", "sess-key-1"),
        ("setting correction_api_key", "corr-key-2"),
        ("setting ark_access_key", "AKLT-ak-3"),
        ("setting ark_secret_key", "ark-sk-4"),
        ("setting redis_url (password in the URL)", "red@is-pw"),
        ("setting kafka_bootstrap (password in the URL)", "kafka-pw-5"),
    }
    assert all("default" != value and "svc" != value for _, value in found)  # user names are not secrets


async def test_a_short_secret_is_reported_at_start_up_by_bot_and_field_never_by_value(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = Runtime(_settings(redis_url=redis_url), send=_discard)
    caplog.set_level(logging.WARNING, logger="pipeline.runtime")
    await runtime.start()
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        [warning] = [w for w in warnings if "leak check" in w]
        assert "bot onebot/qq1, credential 'secret'" in warning and "whole word" in warning
        assert "abc12" not in "".join(warnings)
        # Still matched, as a whole word, in every bot's output.
        assert runtime.leak_scanner.scan("the secret is abc12").hits == 1
        assert runtime.leak_scanner.scan("xabc12y").hits == 0
        assert runtime.leak_scanner.scan("TG-SECRET-8812").hits == 1  # the other bot's secret
    finally:
        await runtime.stop()


async def _discard(topic: str, key: str | None, value: bytes) -> None:
    return None


@pytest.mark.parametrize(
    ("error", "labels"),
    [
        (
            {"type": "model_overloaded_error", "retry_status": {"type": "retrying"}},
            ("model_overloaded_error", "retrying"),
        ),
        ({"type": "billing_error", "retry_status": {"type": "terminal"}}, ("billing_error", "terminal")),
        ({"type": "unknown_error", "retry_status": {"type": "exhausted"}}, ("unknown_error", "exhausted")),
        ({"type": "x" * 500, "retry_status": {"type": "retry in 5s, id 93f1"}}, ("other", "other")),
        ({"type": "malformed", "retry_status": {"type": "malformed"}}, ("other", "other")),
    ],
)
def test_session_error_labels_stay_in_the_protocols_vocabulary(
    error: dict[str, object], labels: tuple[str, str]
) -> None:
    assert session_error_labels(SessionError.model_validate({"type": "session.error", "error": error})) == labels


def test_session_error_metric_counts_unknown_values_as_other() -> None:
    labels = {"error_type": "other", "retry_status": "other"}
    before = REGISTRY.get_sample_value("switchboard_session_errors_total", labels) or 0.0
    record = SessionEventRecord(
        conversation_key="console:demo:c",
        session_id="s1",
        event={"type": "session.error", "error": {"type": "session 93f1 rejected", "retry_status": {"type": "??"}}},
    )
    assert RenderStage.handle_inline(record)
    assert REGISTRY.get_sample_value("switchboard_session_errors_total", labels) == before + 1


def test_a_shortened_tool_input_never_ends_inside_a_marker() -> None:
    text = "x" * 195 + "[redacted] tail"
    assert _shortened(text, 200) == "x" * 195 + "[redacted]"
    assert _shortened("y" * 300, 200) == "y" * 200
    assert _shortened("short", 200) == "short"


async def test_rejected_media_of_a_reply_are_counted_and_logged_with_their_reason(
    redis_url: str, redis_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    settings = Settings(bots=[BotConfig(platform="onebot", bot_id="qq1", language="en")])
    state = State.connect(redis_url, redis_prefix)
    produced: list[bytes] = []

    async def record(topic: str, key: str | None, value: bytes) -> None:
        produced.append(value)

    media = MediaChecker(MediaSettings(), SafeFetcher())
    render = RenderStage(
        settings,
        state,
        Outputs(record),
        Notifier(settings),
        {("onebot", "qq1"): reply_policy(settings.bots[0], settings)},
        {"onebot": Capabilities()},
        ImTools(settings, state.conversations),
        media=media,
    )
    conversation = "onebot:qq1:group_5"
    turn = TurnRecord(trace_id="t", platform="onebot", bot_id="qq1", chat_id="group_5", chat_type="group")
    await running_turn(state, conversation, turn, "m1")
    hidden = "http://10.1.2.3/internal.png"
    reply = {
        "segments": [
            {"type": "text", "data": {"text": "two pictures:"}},
            {"type": "image", "data": {"media": {"kind": "url", "value": hidden}}},
            {"type": "image", "data": {"media": {"kind": "path", "value": "/etc/passwd"}}},
        ]
    }
    before = {r: _rejected(r) for r in ("address_private", "path_not_allowed")}
    caplog.set_level(logging.INFO, logger="pipeline.stages.render")
    try:
        for event in (
            {"type": "agent.message", "id": "e1", "content": [{"type": "text", "text": json.dumps(reply)}]},
            {"type": "session.status_idle", "id": "e2", "stop_reason": {"type": "end_turn"}},
        ):
            await render.handle(
                SessionEventRecord(
                    conversation_key=conversation,
                    session_id="s1",
                    event=event,
                )
            )
    finally:
        await media.aclose()
        await state.redis.aclose()
    [message] = [OutboundMessage.model_validate_json(v) for v in produced if b'"kind":"reply"' in v]
    shown = "".join(s.data.text for s in message.segments)  # type: ignore[union-attr]
    assert shown == "two pictures: [attachment unavailable] [attachment unavailable]"
    assert {r: _rejected(r) - before[r] for r in before} == {"address_private": 1, "path_not_allowed": 1}
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("address_private" in line for line in lines) and any("path_not_allowed" in line for line in lines)
    assert not any(hidden in line or "/etc/passwd" in line for line in lines)


def _rejected(reason: str) -> float:
    labels = {"platform": "onebot", "reason": reason}
    return REGISTRY.get_sample_value("switchboard_media_rejected_total", labels) or 0.0
