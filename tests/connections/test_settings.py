"""The `transport` of a bot, checked with the rest of the bots file: every problem named by entry
and field, before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.connections import transports
from pipeline.errors import ConfigurationError
from pipeline.platforms import get_platform, known_platforms
from pipeline.platforms.checks import bot_problems
from pipeline.settings import Settings, load_settings

BOTS = """
[[bots]]
platform = "onebot"
bot_id = "hook"
credentials = { secret = "s" }

[[bots]]
platform = "onebot"
bot_id = "rev"
transport = "ws-reverse"

[[bots]]
platform = "onebot"
bot_id = "fwd"
transport = "ws-forward"
api_base = "http://127.0.0.1:3000"

[[bots]]
platform = "telegram"
bot_id = "tg"
transport = "ws-reverse"
credentials = { token = "123:abc" }

[[bots]]
platform = "onebot"
bot_id = "typo"
transport = "websocket"

[[bots]]
platform = "onebot"
bot_id = "http"
api_base = "ws://127.0.0.1:3001"
credentials = { secret = "s" }

[[bots]]
platform = "telegram"
bot_id = "hooked"
delete_webhook = true
credentials = { token = "123:abc", webhook_secret = "s" }
"""


def test_every_transport_problem_is_named_by_entry_and_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "bots.toml"
    config.write_text(BOTS)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    with pytest.raises(ConfigurationError) as error:
        load_settings("up", bots_check=bot_problems)
    assert error.value.problems == [
        f"{config}: bots[1].credentials.access_token: required for onebot ws-reverse (bot 'rev')",
        f"{config}: bots[2].api_base: ws-forward dials the implementation's WebSocket server: a ws:// or "
        "wss:// URL (bot 'fwd')",
        f"{config}: bots[3].transport: telegram does not offer transport 'ws-reverse' (bot 'tg'); it offers: webhook, "
        "polling",
        f"{config}: bots[4].transport: onebot does not offer transport 'websocket' (bot 'typo'); it offers: "
        "webhook, ws-reverse, ws-forward",
        f"{config}: bots[5].api_base: a webhook bot calls the implementation's HTTP API: an http:// or https:// URL "
        "(bot 'http')",
        f"{config}: bots[6].delete_webhook: applies to transport = \"polling\" only (bot 'hooked')",
    ]


def test_a_webhook_bot_without_its_secret_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Safe by default: a webhook nobody signs would take any request from anyone who knows its URL."""
    config = tmp_path / "bots.toml"
    config.write_text(
        '[[bots]]\nplatform = "onebot"\nbot_id = "qq"\n\n'
        '[[bots]]\nplatform = "telegram"\nbot_id = "tg"\ncredentials = { token = "123:abc" }\n\n'
        '[[bots]]\nplatform = "telegram"\nbot_id = "polled"\ntransport = "polling"\ncredentials = { token = "1:a" }\n'
    )
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    with pytest.raises(ConfigurationError) as error:
        load_settings("up", bots_check=bot_problems)
    assert error.value.problems == [
        f"{config}: bots[0].credentials.secret: required for onebot webhook (bot 'qq')",
        f"{config}: bots[1].credentials.webhook_secret: required for telegram webhook (bot 'tg')",
    ]


def test_valid_transports_load_and_webhook_stays_the_default() -> None:
    settings = Settings(
        bots=[
            {"platform": "onebot", "bot_id": "a", "credentials": {"secret": "s"}},
            {"platform": "onebot", "bot_id": "b", "transport": "ws-reverse", "credentials": {"access_token": "t"}},
            {"platform": "onebot", "bot_id": "c", "transport": "ws-forward", "api_base": "wss://napcat:3001"},
            {"platform": "telegram", "bot_id": "d", "transport": "polling", "credentials": {"token": "1:a"}},
        ]
    )
    assert [b.transport for b in settings.bots] == ["webhook", "ws-reverse", "ws-forward", "polling"]
    polled = settings.bots[3]
    assert polled.poll_timeout_seconds == 30 and polled.delete_webhook is False
    # A polling bot has no webhook: no warning about an unsigned one.
    assert get_platform("telegram").startup_warnings(polled) == []


def test_a_poll_timeout_telegram_would_not_take_is_refused() -> None:
    bot = {"platform": "telegram", "bot_id": "d", "transport": "polling", "credentials": {"token": "1:a"}}
    with pytest.raises(ValueError, match="poll_timeout_seconds"):
        Settings(bots=[{**bot, "poll_timeout_seconds": 60}])


def test_the_acquire_interval_must_be_shorter_than_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_LEASE_SECONDS", "2")
    monkeypatch.setenv("SWITCHBOARD_CONNECTION_ACQUIRE_INTERVAL_SECONDS", "3")
    with pytest.raises(ConfigurationError) as error:
        load_settings("up", bots_check=bot_problems)
    assert error.value.problems == [
        "settings: SWITCHBOARD_CONNECTION_ACQUIRE_INTERVAL_SECONDS must be shorter than "
        "SWITCHBOARD_CONNECTION_LEASE_SECONDS"
    ]


def test_every_long_connection_a_platform_offers_has_a_transport() -> None:
    offered = {
        (name, transport)
        for name in known_platforms()
        for transport in get_platform(name).transports
        if transport != "webhook" and transport not in get_platform(name).pushed_transports
    }
    assert offered == set(transports())
    for (platform, name), transport in transports().items():
        assert (transport.platform, transport.name) == (platform, name)
