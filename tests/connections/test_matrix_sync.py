"""Matrix `/sync` (transport `sync`) against the stand-in homeserver (`matrix_standin`, events built by
mautrix), with the lease and the `since` token on a real Redis: the first sync skips history; a
synced event is the message the platform's parser makes of its frame; the token is committed only
after the broker acknowledged, under the lease, and a new holder syncs on from it; direct rooms,
replies to the bot and display names are looked up; an access token of another user fails the dial."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from pipeline import metrics
from pipeline.settings import BotConfig
from tests.metric_values import current

from .conftest import Produced
from .matrix_standin import ACCESS_TOKEN, BOT_USER, SERVER, Homeserver
from .test_onebot_ws import inbound, running, until

GROUP, PAIR = f"!group:{SERVER}", f"!pair:{SERVER}"
ALICE, DAVE = f"@alice:{SERVER}", f"@dave:{SERVER}"


def sync_bot(api_base: str, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="matrix",
        bot_id="mx1",
        self_id=BOT_USER,
        transport="sync",
        credentials={"access_token": ACCESS_TOKEN},
        api_base=api_base,
        poll_timeout_seconds=1,
        **extra,
    )


@pytest.fixture
async def homeserver() -> AsyncIterator[Homeserver]:
    server = Homeserver()
    server.add_room(GROUP, [ALICE, f"@bob:{SERVER}"])
    server.add_room(PAIR, [DAVE])
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def test_history_is_skipped_then_new_events_are_produced_and_the_token_waits_for_the_broker(
    homeserver: Homeserver, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    homeserver.add(GROUP, homeserver.text_event(GROUP, ALICE, "old", mention=True))
    produced.hold = True
    async with running(redis_url, redis_prefix, produced, sync_bot(homeserver.url)) as connections:
        await until(lambda: any("since" in q for q in homeserver.syncs), "the first sync done")
        assert await connections.store.resume_state("matrix", "mx1") == "s1"
        bot_said = homeserver.text_event(GROUP, BOT_USER, "earlier answer")
        homeserver.events[bot_said["event_id"]] = bot_said  # in the room before: replies point at it
        reply = homeserver.text_event(GROUP, ALICE, "and then?", reply_to=bot_said["event_id"])
        homeserver.add(GROUP, reply)
        homeserver.add(PAIR, homeserver.text_event(PAIR, DAVE, "hi"))
        await until(lambda: len(inbound(produced)) == 2, "both produced")
        await asyncio.sleep(0.5)  # another sync would have come by now, had the token moved
        assert await connections.store.resume_state("matrix", "mx1") == "s1"
        assert [q.get("since") for q in homeserver.syncs if "since" in q] == ["s1"]
        for ack in produced.acks:
            ack.set_result(None)
        await until(lambda: any(q.get("since") == "s3" for q in homeserver.syncs), "synced on from s3")
        assert await connections.store.resume_state("matrix", "mx1") == "s3"
    first_syncs = [q for q in homeserver.syncs if "since" not in q]
    assert len(first_syncs) == 1 and first_syncs[0]["timeout"] == "0"
    in_group, in_pair = inbound(produced)
    assert in_group.text == "and then?" and in_group.chat_type == "group"
    assert in_group.sender.name == "User alice"  # from the lazy-loaded member event
    assert in_group.reply_to is not None and in_group.reply_to.is_bot  # looked up: the bot wrote it
    assert in_pair.chat_type == "private"  # two joined members
    assert homeserver.requests[f"GET /_matrix/client/v3/rooms/{PAIR}/joined_members"] == 1
    assert homeserver.errors == [] and homeserver.overlaps == 0


async def test_a_new_holder_syncs_on_from_the_saved_token(
    homeserver: Homeserver, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    async with running(redis_url, redis_prefix, produced, sync_bot(homeserver.url)):
        await until(lambda: any("since" in q for q in homeserver.syncs), "the first sync done")
        homeserver.add(PAIR, homeserver.text_event(PAIR, DAVE, "one"))
        await until(lambda: any(q.get("since") == "s1" for q in homeserver.syncs), "one synced and committed")
    homeserver.add(PAIR, homeserver.text_event(PAIR, DAVE, "two"))  # while nobody syncs
    before = len(homeserver.syncs)
    async with running(redis_url, redis_prefix, produced, sync_bot(homeserver.url), holder="w2"):
        await until(lambda: len(inbound(produced)) == 2, "two synced by the new holder")
        assert homeserver.syncs[before].get("since") == "s1"  # from Redis, not a first sync
    assert [m.text for m in inbound(produced)] == ["one", "two"]
    assert homeserver.errors == [] and homeserver.overlaps == 0


async def test_an_access_token_of_another_user_fails_the_dial(
    homeserver: Homeserver, redis_url: str, redis_prefix: str, produced: Produced
) -> None:
    failed = metrics.CONNECTION_HANDSHAKES.labels("matrix", "dial_failed")
    before = current(failed)
    bot = sync_bot(homeserver.url).model_copy(update={"self_id": f"@other:{SERVER}"})
    async with running(redis_url, redis_prefix, produced, bot):
        await until(lambda: current(failed) >= before + 2, "dials fail")
    assert homeserver.syncs == []
    assert homeserver.requests["GET /_matrix/client/v3/account/whoami"] >= 2


async def test_a_since_token_the_homeserver_refuses_is_an_error_naming_the_fix(
    homeserver: Homeserver,
    redis_url: str,
    redis_prefix: str,
    produced: Produced,
    redis_client: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await redis_client.set(f"{redis_prefix}resume:matrix:mx1", "s999")  # from a homeserver since restored
    refused = metrics.CONNECTION_POLL_ERRORS.labels("matrix", "mx1", "bad_request")
    before = current(refused)
    async with running(redis_url, redis_prefix, produced, sync_bot(homeserver.url)):
        await until(lambda: current(refused) > before, "the refused sync counted")
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors and all("refused the sync" in e and "resume:matrix:mx1" in e for e in errors), errors
    assert ACCESS_TOKEN not in caplog.text
    # Refused as a homeserver refuses it (the stand-in notes it among the requests it refused).
    assert set(homeserver.errors) == {"sync: since 's999' is no token this server gave"}
