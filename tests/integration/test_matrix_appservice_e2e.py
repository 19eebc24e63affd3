"""Matrix's application-service transport end to end: the stand-in homeserver
(`tests/connections/matrix_standin.py`, events built by mautrix) pushes transactions to the
workers' `/webhooks/matrix/<bot>/_matrix/app/v1/transactions/{txnId}` with the `hs_token`, through
a real broker, Redis, the simulator and two worker processes; replies go out with the `as_token`
as the bot's user, each request checked as Synapse checks an application service's. The
simulator's agent echoes, so `m<n>` is answered `echo: … m<n>`.

Covered: a group-room message that mentions the bot, a direct-room message and a mention in a
thread, their transaction delivered twice to one worker and once more to the other (a homeserver
retrying behind a load balancer), each answered once in its own room (and thread); a message that
does not address the bot gets no answer; a forged and a missing `hs_token` are refused (403, 401),
counted, and produce nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from pipeline.embedded import RedisServer
from pipeline.kafka import consume_until
from pipeline.stack import Stack
from pipeline.topics import IM_INBOUND
from tests.conftest import enabled_brokers
from tests.connections.matrix_standin import AS_TOKEN, BOT_USER, HS_TOKEN, SERVER, Homeserver

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack, stack_idle
from .test_long_connections import metric, wait_for

pytestmark = [pytest.mark.integration]

BOT_ID = "mxas1"
GROUP = f"!group:{SERVER}"
DIRECT = f"!direct:{SERVER}"  # in the bot's m.direct
ALICE, CAROL = f"@alice:{SERVER}", f"@carol:{SERVER}"


class HomeserverThread(LoopThread[Homeserver]):
    def __init__(self) -> None:
        async def make() -> Homeserver:
            homeserver = Homeserver()
            homeserver.add_room(GROUP, [ALICE, f"@bob:{SERVER}"])
            homeserver.add_room(DIRECT, [CAROL], direct_with=CAROL)
            return await homeserver.start()

        async def close(homeserver: Homeserver) -> None:
            await homeserver.stop()

        super().__init__("matrix-appservice-standin", make, close)

    @property
    def it(self) -> Homeserver:
        assert self.standin is not None
        return self.standin

    async def push(self, events: list[dict[str, Any]], **options: Any) -> tuple[str, int, Any]:
        result: tuple[str, int, Any] = await self._on_loop(self.it.push(events, **options))
        return result


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def homeserver(broker_kind: str) -> Iterator[HomeserverThread]:
    thread = HomeserverThread()
    thread.start_loop()
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, homeserver: HomeserverThread) -> Iterator[Stack]:
    toml = (
        f'[[bots]]\nplatform = "matrix"\nbot_id = "{BOT_ID}"\ntransport = "appservice"\nself_id = "{BOT_USER}"\n'
        f'api_base = "{homeserver.it.url}"\nlanguage = "en"\n'
        f'credentials = {{ hs_token = "{HS_TOKEN}", as_token = "{AS_TOKEN}" }}\n'
    )
    with running_stack(broker_kind, name="matrix-as", bots_toml=toml, redis_url=redis_server.url) as s:
        asyncio.run(add_workers(s))
        homeserver.it.appservice_url = f"{s.workers[0].url}/webhooks/matrix/{BOT_ID}"
        yield s


@pytest.fixture(autouse=True)
def _standin_saw_only_valid_requests(homeserver: HomeserverThread) -> Iterator[None]:
    yield
    assert homeserver.it.errors == [], "requests a homeserver would refuse"


_numbers = itertools.count(1)


def answers(homeserver: HomeserverThread, room_id: str, event_id: str) -> list[dict[str, Any]]:
    """The bot's events in `room_id` replying to `event_id`."""
    return [
        s.content
        for s in homeserver.it.sent_to(room_id)
        if s.content.get("m.relates_to", {}).get("m.in_reply_to", {}).get("event_id") == event_id
    ]


async def test_a_mention_in_a_room_and_a_direct_message_delivered_again_are_answered_once_in_their_room(
    stack: Stack, homeserver: HomeserverThread
) -> None:
    assert len(stack.workers) == 2
    g, d, t, quiet = (next(_numbers) for _ in range(4))
    group = homeserver.it.text_event(GROUP, ALICE, f"m{g}", mention=True)
    direct = homeserver.it.text_event(DIRECT, CAROL, f"m{d}")
    ignored = homeserver.it.text_event(GROUP, ALICE, f"m{quiet} not for the bot")
    threaded = homeserver.it.text_event(GROUP, ALICE, f"m{t}", mention=True)
    root = f"$root{t}"
    threaded["content"]["m.relates_to"] = {"rel_type": "m.thread", "event_id": root, "is_falling_back": True}
    events = [group, direct, ignored, threaded]
    other_worker = f"{stack.workers[1].url}/webhooks/matrix/{BOT_ID}"

    txn, status, answer = await homeserver.push(events)
    assert (status, answer) == (200, {})
    # The homeserver's retries of the same transaction: to the same worker, then to the other one.
    assert (await homeserver.push(events, txn_id=txn))[1:] == (200, {})
    assert (await homeserver.push(events, txn_id=txn, url=other_worker))[1:] == (200, {})

    await wait_for(
        lambda: all(
            answers(homeserver, r, e["event_id"]) for r, e in ((GROUP, group), (DIRECT, direct), (GROUP, threaded))
        ),
        "answered",
        60,
    )
    await stack_idle(stack)
    for room_id, event, n in ((GROUP, group, g), (DIRECT, direct, d)):
        [reply] = answers(homeserver, room_id, event["event_id"])
        assert reply["msgtype"] == "m.text" and reply["body"].startswith("echo: ") and f"m{n}" in reply["body"]
        assert "room" not in reply["m.mentions"], reply
    assert answers(homeserver, GROUP, ignored["event_id"]) == []
    [in_thread] = answers(homeserver, GROUP, threaded["event_id"])
    assert f"m{t}" in in_thread["body"]
    assert in_thread["m.relates_to"] == {
        "rel_type": "m.thread",
        "event_id": root,
        "m.in_reply_to": {"event_id": threaded["event_id"]},
    }
    # Every answer was sent as the bot's user with the application service's token, stored once.
    for stored in homeserver.it.stored:
        assert stored.txn_id.startswith("sb.") and homeserver.it.events[stored.event_id]["sender"] == BOT_USER
    assert len({s.txn_id for s in homeserver.it.stored}) == len(homeserver.it.stored)
    # The first worker answered its retry without producing; the other produced the events again,
    # and they were answered once all the same (ingest drops copies by event id).
    assert await metric(stack.workers[0], "switchboard_webhooks_total", platform="matrix", outcome="redelivered") == 1.0
    assert await metric(stack.workers[1], "switchboard_webhooks_total", platform="matrix", outcome="accepted") == 1.0


async def test_a_forged_or_missing_hs_token_is_refused_and_produces_nothing(
    stack: Stack, homeserver: HomeserverThread
) -> None:
    n = next(_numbers)
    event = homeserver.it.text_event(DIRECT, CAROL, f"m{n} forged")
    _, forged, body = await homeserver.push([event], token="not-the-hs-token")
    assert forged == 403 and body["errcode"] == "M_FORBIDDEN"
    _, missing, body = await homeserver.push([event], token=None)
    assert missing == 401 and body["errcode"] == "M_UNAUTHORIZED"
    worker = stack.workers[0]
    assert await metric(worker, "switchboard_webhooks_total", platform="matrix", outcome="bad_token") == 1.0
    assert await metric(worker, "switchboard_webhooks_total", platform="matrix", outcome="missing_token") == 1.0

    # The genuine message after them, with the same event id: had a refused one got in, it would be
    # the one answered and this one a duplicate.
    genuine = dict(event, content={**event["content"], "body": f"m{n} genuine"})
    assert (await homeserver.push([genuine]))[1] == 200
    await wait_for(lambda: answers(homeserver, DIRECT, event["event_id"]), "the genuine one answered", 60)
    texts: list[str] = []

    def found(record: Any) -> bool:
        texts.append(json.loads(record.value).get("text", ""))
        return f"m{n} genuine" in texts[-1]

    await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], IM_INBOUND, found, timeout=30)
    assert not [text for text in texts if f"m{n} forged" in text], texts
    await stack_idle(stack)
    [reply] = answers(homeserver, DIRECT, event["event_id"])
    assert reply["body"].endswith(f"m{n} genuine")
    assert not [s for s in homeserver.it.stored if "forged" in s.content["body"]]
