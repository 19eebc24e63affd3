"""OneBot reverse WebSocket: the newest authenticated socket takes the bot over, and every time it
does the worker says so (a WARNING naming the peer's address, never the token) and counts it
(`switchboard_connection_replacements_total`); a socket of one role never replaces a universal one.
Real sockets to a worker's connection routes, leases on a real Redis."""

from __future__ import annotations

import logging

import aiohttp
import pytest

from pipeline import metrics
from pipeline.connections.onebot import Refused, reverse_handshake
from tests.metric_values import current

from .conftest import Produced
from .test_onebot_ws import SELF_ID, TOKEN, bot, running, until, web_app

AUTH = {"Authorization": f"Bearer {TOKEN}", "X-Self-ID": str(SELF_ID)}


def replacements(outcome: str) -> float:
    return current(metrics.CONNECTION_REPLACEMENTS.labels("onebot", "qq1", outcome))


def held() -> float:
    return current(metrics.CONNECTIONS_HELD.labels("onebot", "ws-reverse"))


async def test_an_event_only_socket_does_not_replace_a_universal_one(
    redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    before = replacements("refused_partial")
    async with (
        running(redis_url, redis_prefix, produced, bot("ws-reverse")) as connections,
        web_app(connections) as base,
        aiohttp.ClientSession() as http,
    ):
        universal = await http.ws_connect(f"{base}/onebot/ws/qq1", headers=AUTH)
        await until(lambda: held() == 1, "the universal socket holds the bot")
        [api_before, event_before] = await connections.store.holders(
            [("onebot", "qq1", "api"), ("onebot", "qq1", "event")]
        )
        with caplog.at_level(logging.WARNING), pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{base}/onebot/ws/qq1/event", headers=AUTH)
        assert refused.value.status == 409
        # The universal socket still holds both channels, under the same lease.
        [api, event] = await connections.store.holders([("onebot", "qq1", "api"), ("onebot", "qq1", "event")])
        assert api is not None and event is not None and api.owner == event.owner
        assert (api, event) == (api_before, event_before)
        assert not universal.closed
        await universal.close()
    assert replacements("refused_partial") == before + 1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING and "a universal one holds" in r.message]
    assert "127.0.0.1" in warning.getMessage() and TOKEN not in caplog.text


async def test_a_newer_universal_socket_replaces_the_holder_and_is_logged_and_counted(
    redis_url: str, redis_prefix: str, produced: Produced, caplog: pytest.LogCaptureFixture
) -> None:
    before = replacements("replaced")
    async with (
        running(redis_url, redis_prefix, produced, bot("ws-reverse"), lease=1.5) as connections,
        web_app(connections) as base,
        aiohttp.ClientSession() as http,
    ):
        first = await http.ws_connect(f"{base}/onebot/ws/qq1", headers=AUTH)
        await until(lambda: held() == 1, "the first socket holds the bot")
        assert replacements("replaced") == before  # nobody held it: no replacement
        with caplog.at_level(logging.WARNING):
            second = await http.ws_connect(f"{base}/onebot/ws/qq1?access_token={TOKEN}")
            # The older socket is closed by its holder at its next renewal.
            await first.receive(timeout=5)
            assert first.closed
        [api] = await connections.store.holders([("onebot", "qq1", "api")])
        assert api is not None and api.token == 2
        await second.close()
    assert replacements("replaced") == before + 1
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING and "replaces" in r.getMessage()]
    assert "127.0.0.1" in warning.getMessage()
    assert TOKEN not in caplog.text  # the token came in the URL this time: still never logged


@pytest.mark.parametrize(
    "authorization",
    ["Bearer \udcc3\udca9", f"Bearer {TOKEN}\udcff", "Bearer \u00e9t\u00e9"],
)
def test_a_non_ascii_token_is_a_401_not_an_exception(authorization: str) -> None:
    # Header values reach the handshake decoded with surrogateescape: any character at all.
    with pytest.raises(Refused) as refused:
        reverse_handshake(bot("ws-reverse"), {"authorization": authorization}, {}, None)
    assert (refused.value.status, refused.value.reason) == (401, "bad_token")
    with pytest.raises(Refused):
        reverse_handshake(bot("ws-reverse"), {}, {"access_token": authorization[7:]}, None)
