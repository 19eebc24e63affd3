"""Matrix end to end: room events in over `/sync`, replies out with `PUT …/send/m.room.message/{txnId}`,
through a real broker, Redis, the simulator and two worker processes. The stand-in homeserver
(`tests/connections/matrix_standin.py`, events built by mautrix) is served from a thread of its own
and checks every request; the simulator's agent echoes, so `m<n>` is answered `echo: … m<n>`.

Covered: the first sync skips the rooms' history; a group-room message that mentions the bot, a
direct-room message and a mention in a thread, each on the stream twice (the same event id in two
syncs), each answered once in its own room (and thread) with `m.in_reply_to` the event; a group
message that does not address the bot gets no answer, a reply to the bot's message does; an
encrypted event is counted and its room told once; the sync holder SIGKILLed mid-traffic, a
survivor takes the lease, syncs on from the `since` token saved in Redis (never a first sync
again), and every message is answered once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.embedded import RedisServer
from pipeline.stack import Stack
from tests.conftest import enabled_brokers
from tests.connections.matrix_standin import ACCESS_TOKEN, BOT_USER, SERVER, Homeserver

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack, stack_idle
from .test_long_connections import TAKEOVER_QUIET_SECONDS, lease_holder, metric, wait_for

pytestmark = [pytest.mark.integration]

BOT_ID = "mx1"
GROUP = f"!group:{SERVER}"
DIRECT = f"!direct:{SERVER}"  # in the bot's m.direct
PAIR = f"!pair:{SERVER}"  # two members, not in m.direct: private too
SECRET = f"!secret:{SERVER}"  # an encrypted room
ALICE, CAROL, DAVE = f"@alice:{SERVER}", f"@carol:{SERVER}", f"@dave:{SERVER}"


class HomeserverThread(LoopThread[Homeserver]):
    def __init__(self) -> None:
        async def make() -> Homeserver:
            homeserver = Homeserver()
            homeserver.add_room(GROUP, [ALICE, f"@bob:{SERVER}"])
            homeserver.add_room(DIRECT, [CAROL], direct_with=CAROL)
            homeserver.add_room(PAIR, [DAVE])
            homeserver.add_room(SECRET, [ALICE, CAROL])
            return await homeserver.start()

        async def close(homeserver: Homeserver) -> None:
            await homeserver.stop()

        super().__init__("matrix-standin", make, close)

    @property
    def it(self) -> Homeserver:
        assert self.standin is not None
        return self.standin

    async def post(self, room_id: str, event: dict[str, Any], *, times: int = 1) -> None:
        """Put `event` on the stream `times` times, each after a sync served the one before."""

        for copy in range(times):
            served = self.it.served[event["event_id"]]

            async def add() -> None:
                self.it.add(room_id, event)

            await self._on_loop(add())
            if copy + 1 < times:
                await wait_for(lambda s=served: self.it.served[event["event_id"]] > s, "the first copy synced", 60)


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def homeserver(broker_kind: str) -> Iterator[HomeserverThread]:
    thread = HomeserverThread()
    thread.start_loop()
    # History from before the bot's first sync: never answered.
    thread.it.add(GROUP, thread.it.text_event(GROUP, ALICE, "old m0", mention=True, event_id="$history"))
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, homeserver: HomeserverThread) -> Iterator[Stack]:
    toml = (
        f'[[bots]]\nplatform = "matrix"\nbot_id = "{BOT_ID}"\ntransport = "sync"\nself_id = "{BOT_USER}"\n'
        f'api_base = "{homeserver.it.url}"\npoll_timeout_seconds = 2\nlanguage = "en"\n'
        f'credentials = {{ access_token = "{ACCESS_TOKEN}" }}\n'
    )
    with running_stack(broker_kind, name="matrix", bots_toml=toml, redis_url=redis_server.url) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(autouse=True)
def _standin_saw_only_valid_requests(homeserver: HomeserverThread) -> Iterator[None]:
    yield
    assert homeserver.it.errors == [], "requests a homeserver would refuse"
    assert homeserver.it.overlaps == 0, "two holders synced at once"


_numbers = itertools.count(1)


def answers(homeserver: HomeserverThread, room_id: str, event_id: str) -> list[dict[str, Any]]:
    """The bot's events in `room_id` replying to `event_id`."""
    return [
        s.content
        for s in homeserver.it.sent_to(room_id)
        if s.content.get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id") == event_id
    ]


async def synced(homeserver: HomeserverThread) -> None:
    await wait_for(lambda: any("since" in q for q in homeserver.it.syncs), "the bot syncs", 60)


async def test_a_mention_in_a_room_and_a_direct_message_each_twice_are_answered_once_in_their_room(
    stack: Stack, homeserver: HomeserverThread
) -> None:
    await synced(homeserver)
    first_syncs = [q for q in homeserver.it.syncs if "since" not in q]
    assert len(first_syncs) == 1 and first_syncs[0]["timeout"] == "0", first_syncs
    g, d, p, quiet = (next(_numbers) for _ in range(4))
    group = homeserver.it.text_event(GROUP, ALICE, f"m{g}", mention=True)
    direct = homeserver.it.text_event(DIRECT, CAROL, f"m{d}")
    pair = homeserver.it.text_event(PAIR, DAVE, f"m{p}")
    ignored = homeserver.it.text_event(GROUP, ALICE, f"m{quiet} not for the bot")
    t = next(_numbers)
    threaded = homeserver.it.text_event(GROUP, ALICE, f"m{t}", mention=True)
    root = f"$root{t}"
    threaded["content"]["m.relates_to"] = {"rel_type": "m.thread", "event_id": root, "is_falling_back": True}
    await homeserver.post(GROUP, group, times=2)
    await homeserver.post(DIRECT, direct, times=2)
    await homeserver.post(PAIR, pair)
    await homeserver.post(GROUP, ignored)
    await homeserver.post(GROUP, threaded, times=2)
    await wait_for(
        lambda: all(
            answers(homeserver, r, e["event_id"])
            for r, e in ((GROUP, group), (DIRECT, direct), (PAIR, pair), (GROUP, threaded))
        ),
        "answered",
        60,
    )
    await stack_idle(stack)
    assert homeserver.it.served[group["event_id"]] == 2 and homeserver.it.served[direct["event_id"]] == 2
    for room_id, event, n in ((GROUP, group, g), (DIRECT, direct, d), (PAIR, pair, p)):
        [answer] = answers(homeserver, room_id, event["event_id"])
        assert answer["msgtype"] == "m.text" and answer["body"].startswith("echo: ") and f"m{n}" in answer["body"]
        assert "room" not in answer["m.mentions"], answer
        assert [s for s in homeserver.it.sent_to(room_id) if f"m{n}" in s.content["body"]], room_id
    assert answers(homeserver, GROUP, ignored["event_id"]) == []
    # In its thread: the answer stays there, replying to the message it answers.
    [in_thread] = answers(homeserver, GROUP, threaded["event_id"])
    assert f"m{t}" in in_thread["body"]
    assert in_thread["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": root,
        "m.in_reply_to": {"event_id": threaded["event_id"]},
    }
    assert answers(homeserver, GROUP, "$history") == [], "the first sync's history was answered"
    # Each answer was stored once: one transaction each, none sent to another room.
    for stored in homeserver.it.stored:
        assert stored.txn_id.startswith("sb.")
    assert len({s.txn_id for s in homeserver.it.stored}) == len(homeserver.it.stored)


async def test_a_reply_to_the_bot_in_a_room_is_answered(stack: Stack, homeserver: HomeserverThread) -> None:
    await synced(homeserver)
    first, n = next(_numbers), next(_numbers)
    mention = homeserver.it.text_event(GROUP, ALICE, f"m{first}", mention=True)
    await homeserver.post(GROUP, mention)
    await wait_for(lambda: answers(homeserver, GROUP, mention["event_id"]), "the mention answered", 60)
    bot_event = next(s.event_id for s in homeserver.it.sent_to(GROUP) if f"m{first}" in s.content["body"])
    reply = homeserver.it.text_event(GROUP, ALICE, f"m{n}", reply_to=bot_event)
    await homeserver.post(GROUP, reply)
    await wait_for(lambda: answers(homeserver, GROUP, reply["event_id"]), "the reply answered", 60)
    await stack_idle(stack)
    [answer] = answers(homeserver, GROUP, reply["event_id"])
    assert f"m{n}" in answer["body"]


async def test_an_encrypted_event_is_counted_and_its_room_told_once(stack: Stack, homeserver: HomeserverThread) -> None:
    await synced(homeserver)
    holder, _ = await lease_holder(stack, BOT_ID, platform="matrix", channel="event")
    assert holder is not None
    events = [homeserver.it.encrypted_event(SECRET, ALICE) for _ in range(2)]
    for event in events:
        await homeserver.post(SECRET, event)
    await wait_for(lambda: all(homeserver.it.served[e["event_id"]] for e in events), "both synced", 60)
    deadline = time.monotonic() + 30
    label = {"platform": "matrix", "outcome": "encrypted"}
    while await metric(holder, "switchboard_connection_frames_total", **label) < 2.0:
        assert time.monotonic() < deadline, "the encrypted events were not counted"
        await asyncio.sleep(0.1)
    assert await metric(holder, "switchboard_connection_frames_total", **label) == 2.0
    [told] = homeserver.it.sent_to(SECRET)
    assert told.content["msgtype"] == "m.notice" and "encrypted" in told.content["body"]


async def test_the_sync_holder_sigkilled_a_survivor_syncs_on_from_the_saved_token_and_every_message_is_answered_once(
    stack: Stack, homeserver: HomeserverThread
) -> None:
    await synced(homeserver)
    holder, token = await lease_holder(stack, BOT_ID, platform="matrix", channel="event")
    assert holder is not None
    sent: dict[int, dict[str, Any]] = {}

    def room(n: int) -> str:
        return f"!pair{n}:{SERVER}"

    async def traffic(seconds: float) -> None:
        """`m<n>` each in a two-member room of its own (one chat each: no merged turns)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            n = next(_numbers)
            user = f"@user{n}:{SERVER}"
            homeserver.it.add_room(room(n), [user])
            sent[n] = homeserver.it.text_event(room(n), user, f"m{n} [sim:think=1.5]")
            await homeserver.post(room(n), sent[n])
            await asyncio.sleep(0.15)

    await traffic(3.0)
    await holder.kill()
    killed = time.monotonic()
    taking_over = asyncio.create_task(traffic(4.0))  # the homeserver keeps them for the next sync

    async def new_holder() -> bool:
        worker, new_token = await lease_holder(stack, BOT_ID, platform="matrix", channel="event")
        return worker is not None and worker is not holder and new_token > token

    deadline = time.monotonic() + 60
    while not await new_holder():
        assert time.monotonic() < deadline, "no worker took the bot over"
        await asyncio.sleep(0.1)
    takeover = time.monotonic() - killed
    await taking_over
    await traffic(2.0)

    def answered() -> Counter[int]:
        counts: Counter[int] = Counter()
        for n, event in sent.items():
            counts[n] = len(answers(homeserver, room(n), event["event_id"]))
        return counts

    await wait_for(lambda: all(answered()[n] for n in sent), f"all answered ({takeover:.1f} s takeover)", 120)
    await stack_idle(stack, quiet=TAKEOVER_QUIET_SECONDS)
    counts = answered()
    again = sum(1 for event in sent.values() if homeserver.it.served[event["event_id"]] > 1)
    print(
        f"\nMatrix sync: {len(sent)} messages, taken over {takeover:.2f} s after SIGKILL (lease 3 s); "
        f"{again} synced again by the new holder (not committed by the old one)"
    )
    assert [n for n in sent if counts[n] != 1] == [], counts
    # The survivor resumed from the token in Redis: the bot's only sync without `since` was its first.
    assert len([q for q in homeserver.it.syncs if "since" not in q]) == 1
    await add_workers(stack)
