"""Slack Socket Mode against a stand-in of Slack (`slack_standin`): the app token on
`apps.connections.open`, envelopes built with slack_sdk's models, acknowledgements checked as Slack
matches them (by `envelope_id`, on the socket that carried the envelope), never before the event's
messages are on the broker; `disconnect` refreshes; a dropped socket is dialed again. Leases on a
real Redis; the producer is the recording stand-in of `conftest`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipeline import metrics
from pipeline.connections import slack as socket_mode
from pipeline.errors import ConfigurationError
from pipeline.platforms.checks import bot_problems
from pipeline.runtime import deployment_secrets
from pipeline.settings import BotConfig, Settings, load_settings
from tests.metric_values import current
from tests.platforms.test_slack import APP_MENTION, BOT_TOKEN, BOT_USER, DM, callback

from .conftest import Produced
from .slack_standin import APP_TOKEN, SlackStandIn, Socket
from .standin_support import PeerGone, frames, same_message, webhook_messages
from .test_onebot_ws import inbound, running, until


@pytest.fixture
async def slack() -> AsyncIterator[SlackStandIn]:
    standin = SlackStandIn()
    await standin.start()
    try:
        yield standin
    finally:
        await standin.stop()
        assert standin.errors == [], "requests or acknowledgements Slack would refuse"


def bot(slack: SlackStandIn, **credentials: str) -> BotConfig:
    return BotConfig(
        platform="slack",
        bot_id="sl1",
        self_id=BOT_USER,
        transport="socket_mode",
        api_base=slack.url,
        credentials={"bot_token": BOT_TOKEN, "app_token": APP_TOKEN, **credentials},
    )


async def test_an_event_becomes_the_webhooks_message_and_is_acknowledged_only_once_on_the_broker(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    config = bot(slack)
    produced.hold = True
    async with running(redis_url, redis_prefix, produced, config):
        await until(lambda: len(slack.open_sockets()) == 1, "socket dialed")
        opened = slack.opens[0]
        assert opened.method == "POST" and opened.headers["authorization"] == f"Bearer {APP_TOKEN}"
        payload = callback(APP_MENTION, event_id="Ev0SOCKET01")
        envelope_id = await slack.send_event(payload)
        await until(lambda: len(inbound(produced)) == 1, "produced")
        [message] = inbound(produced)
        [expected] = webhook_messages(config, payload)
        assert same_message(message, expected), (message, expected)
        assert message.event_id == "Ev0SOCKET01" and message.mentions_bot
        await asyncio.sleep(0.5)  # the broker has not acknowledged: neither may we
        assert slack.acked() == []
        for ack in produced.acks:
            ack.set_result(None)
        await until(lambda: slack.acked() == [envelope_id], "acknowledged once durable")
        assert slack.sockets[0].acked == [envelope_id]


async def test_unhandled_envelopes_are_acknowledged_and_counted_and_hello_is_no_message(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    before = {k: frames("slack", k) for k in ("slash_commands", "interactive", "heartbeat", "not_message")}
    async with running(redis_url, redis_prefix, produced, bot(slack)):
        await until(lambda: len(slack.open_sockets()) == 1, "socket dialed")
        await until(lambda: frames("slack", "heartbeat") > before["heartbeat"], "hello seen")
        slash = {
            "type": "slash_commands",
            "envelope_id": "c1d2e3f4-0000-4000-8000-000000000001",
            "payload": {"command": "/ask", "text": "hi", "user_id": "U123ABC456", "channel_id": "C123ABC456"},
            "accepts_response_payload": True,
        }
        interactive = {
            "type": "interactive",
            "envelope_id": "c1d2e3f4-0000-4000-8000-000000000002",
            "payload": {"type": "block_actions", "user": {"id": "U123ABC456"}},
            "accepts_response_payload": False,
        }
        await slack.send(slash)
        await slack.send(interactive)
        reaction = callback({"type": "reaction_added", "user": "U1", "reaction": "thumbsup"}, event_id="Ev0REACT")
        other = await slack.send_event(reaction)
        await until(lambda: len(slack.acked()) == 3, "every envelope acknowledged")
        assert set(slack.acked()) == {slash["envelope_id"], interactive["envelope_id"], other}
    assert inbound(produced) == []
    assert frames("slack", "slash_commands") == before["slash_commands"] + 1
    assert frames("slack", "interactive") == before["interactive"] + 1
    assert frames("slack", "not_message") == before["not_message"] + 1


async def test_refresh_opens_the_new_socket_before_the_old_one_closes(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pipeline")
    async with running(redis_url, redis_prefix, produced, bot(slack)):
        await until(lambda: len(slack.open_sockets()) == 1, "socket dialed")
        old = slack.sockets[0]
        first = await slack.send_event(callback(DM, event_id="Ev0BEFORE"))
        await slack.disconnect(old, "refresh_requested")
        await until(lambda: len(slack.sockets) == 2, "a second socket")
        assert old.closed is None, "the old socket stays open until its replacement is up"
        assert len(slack.opens) == 2
        # Slack may still deliver on the old socket until it closes it: acknowledged over it.
        late = await slack.send_event(callback(dict(DM, ts="1355517523.000006"), event_id="Ev0LATE"), socket=old)
        await until(lambda: late in old.acked, "the old socket's envelope acknowledged on it")
        await old.ws.close()  # as Slack does some seconds after `disconnect`
        new = slack.sockets[1]
        after = await slack.send_event(callback(dict(DM, ts="1355517523.000007"), event_id="Ev0AFTER"), socket=new)
        await until(lambda: after in new.acked, "the new socket's envelope acknowledged on it")
        assert first in old.acked
        assert [m.event_id for m in inbound(produced)] == ["Ev0BEFORE", "Ev0LATE", "Ev0AFTER"]
        assert len(slack.open_sockets()) == 1 and frames("slack", "disconnect_refresh_requested") >= 1
    assert "Socket Mode socket refreshed" in caplog.text
    assert "ticket=" not in caplog.text and APP_TOKEN not in caplog.text, "the socket URL and the token are secrets"


async def test_a_dropped_socket_is_dialed_again_and_unacknowledged_events_come_again(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    async with running(redis_url, redis_prefix, produced, bot(slack)):
        await until(lambda: len(slack.open_sockets()) == 1, "socket dialed")
        produced.hold = True
        await slack.send_event(callback(DM, event_id="Ev0DROPPED"))
        await until(lambda: len(inbound(produced)) == 1, "produced, not yet acknowledged")
        lost = frames("slack", "ack_lost")
        await slack.sockets[0].ws.close()  # Slack drops it (no `disconnect` first)
        produced.hold = False
        for ack in produced.acks:  # the broker has it now, but the socket is gone
            ack.set_result(None)
        await until(lambda: frames("slack", "ack_lost") == lost + 1, "the acknowledgement had no socket to go out on")
        # Slack sends the unacknowledged event again on the next socket, with a new envelope id.
        await until(lambda: len(slack.open_sockets()) == 1 and len(slack.sockets) == 2, "dialed again")
        await until(lambda: len(slack.sockets[1].acked) == 1, "the redelivery acknowledged")
        redelivered = slack.envelopes[slack.sockets[1].acked[0]].message
        assert redelivered["retry_attempt"] == 1
        # Both copies carry the event id: ingest keeps one (its de-duplication, tested with ingest).
        assert [m.event_id for m in inbound(produced)] == ["Ev0DROPPED", "Ev0DROPPED"]


async def test_a_socket_whose_peer_stops_answering_pings_is_dropped_and_dialed_again(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket_mode, "PING_SECONDS", 0.4)  # 10 s in production
    slack.answer_pings = False
    async with running(redis_url, redis_prefix, produced, bot(slack)):
        await until(lambda: len(slack.sockets) == 1, "socket dialed")
        await until(lambda: slack.sockets[0].closed is not None, "the silent socket closed by its pings", 5)
        slack.answer_pings = True
        await until(lambda: len(slack.open_sockets()) == 1 and len(slack.sockets) == 2, "dialed again")
        envelope_id = await slack.send_event(callback(DM, event_id="Ev0AFTERPING"))
        await until(lambda: slack.acked() == [envelope_id], "the new socket works")


async def test_a_wrong_app_token_fails_the_dial_and_is_counted_and_logged_without_it(
    slack: SlackStandIn, redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pipeline")
    failed = metrics.CONNECTION_HANDSHAKES.labels("slack", "dial_failed")
    before = current(failed)
    wrong = bot(slack, app_token="xapp-1-A0123456789-0000000000000-wrongwrongwrong")
    async with running(redis_url, redis_prefix, produced, wrong):
        await until(lambda: current(failed) > before, "dial failed")
    assert slack.sockets == [] and slack.opens[0].headers["authorization"].startswith("Bearer xapp-")
    assert "apps.connections.open refused: HTTP 200, invalid_auth" in caplog.text
    assert "wrongwrong" not in caplog.text and APP_TOKEN not in caplog.text


def test_the_app_token_is_a_checked_secret_of_the_deployment() -> None:
    settings = Settings(
        bots=[
            {
                "platform": "slack",
                "bot_id": "sm",
                "transport": "socket_mode",
                "credentials": {"bot_token": BOT_TOKEN, "app_token": APP_TOKEN},
            }
        ]
    )
    assert APP_TOKEN in {s.value for s in deployment_secrets(settings)}
    assert APP_TOKEN not in repr(settings) and APP_TOKEN not in str(settings.model_dump())


def test_socket_mode_settings_are_checked_with_the_bots_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bots.toml"
    config.write_text(
        f"""
[[bots]]
platform = "slack"
bot_id = "ok"
transport = "socket_mode"
credentials = {{ bot_token = "{BOT_TOKEN}", app_token = "{APP_TOKEN}" }}

[[bots]]
platform = "slack"
bot_id = "no_app_token"
transport = "socket_mode"
credentials = {{ bot_token = "{BOT_TOKEN}" }}

[[bots]]
platform = "slack"
bot_id = "bot_token_twice"
transport = "socket_mode"
credentials = {{ bot_token = "{BOT_TOKEN}", app_token = "{BOT_TOKEN}" }}

[[bots]]
platform = "slack"
bot_id = "hook"
credentials = {{ bot_token = "{BOT_TOKEN}" }}
"""
    )
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    with pytest.raises(ConfigurationError) as error:
        load_settings("up", bots_check=bot_problems)
    assert error.value.problems == [
        f"{config}: bots[1].credentials.app_token: required for slack socket_mode (bot 'no_app_token')",
        f"{config}: bots[2].credentials.app_token: Socket Mode needs the app-level token, which starts with "
        "xapp- (bot 'bot_token_twice')",
        f"{config}: bots[3].credentials.signing_secret: required for slack webhook (bot 'hook')",
    ]
    assert BOT_TOKEN not in str(error.value)


async def test_the_stand_in_sends_an_envelope_its_dead_socket_refused_on_the_next_socket() -> None:
    """As Slack: an envelope written into a socket whose peer is gone goes to the next socket, and
    is not sent round into the dead one until its attempts run out (it was, once: a message sent
    the moment a holder was SIGKILLed was never delivered, and its test waited for a reply)."""
    standin = SlackStandIn()
    dead = Socket(id=1, ws=PeerGone(), opened=time.monotonic())  # type: ignore[arg-type]
    standin.sockets.append(dead)
    await standin.send_event({"event_id": "Ev00000027", "event": {"type": "message", "channel": "D00000027"}})
    assert len(dead.sent) == 1 and dead.closed is not None
    assert standin.open_sockets() == []
    assert [w["payload"]["event_id"] for w in standin.waiting()] == ["Ev00000027"]
