"""Actions asked for by any worker, run by the holder, through a real Redis: answered over the
queue, `no_holder` / `timeout` when nobody answers, a request asked for again answered (or joined
while it runs) and not run twice, an action sent by a holder that died before its answer answered
`outcome_unknown` instead of being sent again, and a holder whose lease was taken giving the request
back for the new holder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx

from pipeline import metrics
from pipeline.connections import ActionRouter
from pipeline.connections._actions import ActionServer
from pipeline.connections._lease import HeldLease
from pipeline.connections.base import ActionAnswer, Connection, Link
from pipeline.platforms.onebot import OneBotPlatform
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore
from tests.metric_values import current
from tests.platforms.conftest import load_media
from tests.platforms.test_onebot import outbound

BOT = BotConfig(platform="onebot", bot_id="qq1", transport="ws-forward")


class RecordingConnection(Connection):
    """A connection whose actions are recorded and answered after `delay`."""

    transport = "ws-forward"
    channels = frozenset({"api", "event"})

    def __init__(
        self, name: str, delay: float = 0.0, final: bool = True, answers: list[ActionAnswer] | None = None
    ) -> None:
        self.name = name
        self.delay = delay
        self.final = final
        self.answers = answers or []  # given first, in order, instead of a response
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def run(self, link: Link) -> None:
        await asyncio.Event().wait()

    async def call(self, action: str, params: Mapping[str, Any], timeout: float) -> ActionAnswer:
        self.calls.append((action, dict(params)))
        await asyncio.sleep(self.delay)
        if self.answers:
            return self.answers.pop(0)
        response = {"status": "ok", "retcode": 0, "data": {"message_id": len(self.calls)}, "by": self.name}
        return ActionAnswer(response=response, final=self.final)

    async def close(self) -> None:
        return None


@asynccontextmanager
async def holding(
    store: ConnectionStore, holder: str, connection: Connection, *, take: bool = True
) -> AsyncIterator[HeldLease]:
    acquired = await store.acquire("onebot", "qq1", ("api", "event"), holder, 5000, "up", take=take)
    assert acquired is not None
    lease = HeldLease(
        store,
        "onebot",
        "qq1",
        ("api", "event"),
        holder=holder,
        token=acquired.token,
        seconds=5.0,
        state="up",
        acquired_at=time.monotonic(),
    )
    lease.start()
    stop = asyncio.Event()
    server = asyncio.create_task(ActionServer(store, BOT, connection, lease, stop, hold_timeout=10.0).serve())
    try:
        yield lease
    finally:
        stop.set()
        await server
        await lease.release()


def _count(outcome: str) -> float:
    return current(metrics.CONNECTION_ACTIONS.labels("onebot", outcome))


async def test_an_action_from_any_worker_runs_on_the_holder(store: ConnectionStore) -> None:
    connection = RecordingConnection("holder")
    router = ActionRouter(store, timeout=5.0)
    async with holding(store, "worker-a", connection):
        params = {"group_id": 123, "message": [{"type": "text", "data": {"text": "hi"}}]}
        answer = await router.call(BOT, "send_group_msg", params, "out-1:0")
    assert answer.error == "" and answer.response is not None and answer.response["by"] == "holder"
    assert connection.calls == [("send_group_msg", params)]


async def test_no_holder_and_timeout_are_told_apart(store: ConnectionStore) -> None:
    router = ActionRouter(store, timeout=0.5)
    before = _count("no_holder")
    answer = await router.call(BOT, "send_private_msg", {"user_id": 1, "message": []}, "out-2:0")
    assert answer.response is None and answer.error == "no_holder" and "qq1" in answer.detail
    assert _count("no_holder") == before + 1
    # A holder that does not answer in time (its connection is slow): a timeout.
    slow = RecordingConnection("slow", delay=2.0)
    async with holding(store, "worker-a", slow):
        answer = await router.call(BOT, "send_private_msg", {"user_id": 1, "message": []}, "out-3:0")
    assert answer.error == "timeout"


async def test_a_request_asked_for_again_is_answered_without_running_twice(store: ConnectionStore) -> None:
    connection = RecordingConnection("holder", delay=0.8)
    impatient = ActionRouter(store, timeout=0.3)
    joined = _count("joined")
    async with holding(store, "worker-a", connection):
        # The sender gives up while the action runs, and asks again with the same id: joined.
        first = await impatient.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-4:0")
        assert first.error == "timeout"
        patient = ActionRouter(store, timeout=5.0)
        again = await patient.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-4:0")
        assert again.response is not None and again.response["data"] == {"message_id": 1}
        # After it ended for good: answered from Redis.
        third = await patient.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-4:0")
        assert third.response == again.response and third.final
    assert len(connection.calls) == 1 and _count("joined") == joined + 1


async def test_a_retryable_answer_is_not_kept(store: ConnectionStore) -> None:
    connection = RecordingConnection("holder", final=False)  # e.g. retcode 201: may be run again
    router = ActionRouter(store, timeout=5.0)
    async with holding(store, "worker-a", connection):
        await router.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-5:0")
        await router.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-5:0")
    assert len(connection.calls) == 2


async def test_a_holder_whose_lease_was_taken_hands_the_request_on(store: ConnectionStore) -> None:
    old, new = RecordingConnection("old"), RecordingConnection("new")
    router = ActionRouter(store, timeout=8.0)
    before = _count("fenced")
    async with holding(store, "worker-a", old) as old_lease:
        # Another worker accepted a newer connection and took the lease; the old holder renews only
        # every 5/3 s, so it still serves the queue: its fencing token stops it from running.
        taken = await store.acquire("onebot", "qq1", ("api", "event"), "worker-b", 5000, "up", take=True)
        assert taken is not None
        call = asyncio.create_task(router.call(BOT, "send_group_msg", {"group_id": 7, "message": []}, "out-6:0"))
        async with asyncio.timeout(3.0):
            await old_lease.lost.wait()
        assert old_lease.why_lost == "taken" and _count("fenced") == before + 1
        # The request went back to the queue; the new holder's server runs it.
        stop = asyncio.Event()
        new_lease = HeldLease(
            store,
            "onebot",
            "qq1",
            ("api", "event"),
            holder="worker-b",
            token=taken.token,
            seconds=5.0,
            state="up",
            acquired_at=time.monotonic(),
        )
        new_lease.start()
        server = asyncio.create_task(ActionServer(store, BOT, new, new_lease, stop, hold_timeout=10.0).serve())
        answer = await call
        stop.set()
        await server
        await new_lease.release()
    assert answer.response is not None and answer.response["by"] == "new"
    assert old.calls == [] and len(new.calls) == 1


class LateGiveBack(ConnectionStore):
    """The real store, but `give_back`'s reply reaches its caller late (a loaded machine): the serve
    loop, waiting on the same queue, pops the request before the handler goes on."""

    async def give_back(self, platform: str, bot_id: str, request: str) -> None:
        await super().give_back(platform, bot_id, request)
        await asyncio.sleep(0.3)


async def test_a_fenced_holder_gives_the_request_back_once_not_in_a_loop(store: ConnectionStore) -> None:
    late = LateGiveBack(store.redis, store.blocking, store.keys, done_ttl=store.done_ttl)
    router = ActionRouter(store, timeout=1.5)
    before = _count("fenced")
    async with holding(late, "worker-a", RecordingConnection("old")) as old_lease:
        taken = await store.acquire("onebot", "qq1", ("api", "event"), "worker-b", 5000, "up", take=True)
        assert taken is not None
        answer = await router.call(BOT, "send_group_msg", {"group_id": 7, "message": []}, "out-6b:0")
        assert old_lease.why_lost == "taken"
    # Fenced once; the request waits in the queue for the new holder (nobody serves it here).
    assert answer.error == "timeout" and _count("fenced") == before + 1
    assert await store.next_action("onebot", "qq1", timeout=0.1) is not None


async def test_an_action_sent_by_a_holder_that_died_is_answered_outcome_unknown(store: ConnectionStore) -> None:
    # Worker A claimed the action (the claim marks it as being sent), wrote it, and was SIGKILLed
    # before the answer: its lease runs out, B holds the bot, and the sender asks again.
    acquired = await store.acquire("onebot", "qq1", ("api", "event"), "worker-a", 5000, "up", take=True)
    assert acquired is not None
    claim = await store.claim_action("onebot", "qq1", "api", f"worker-a|{acquired.token}", "out-7:0")
    assert claim.kind == "run"
    connection = RecordingConnection("new")
    router = ActionRouter(store, timeout=5.0)
    before, repeated = _count("outcome_unknown"), _count("repeated")
    async with holding(store, "worker-b", connection):
        answer = await router.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-7:0")
        assert answer.response is None and answer.error == "outcome_unknown" and answer.final
        # Recorded as the action's outcome: asked again, the same answer, still not sent.
        again = await router.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-7:0")
        assert again == answer
    assert connection.calls == []
    assert _count("outcome_unknown") == before + 1 and _count("repeated") == repeated + 1


async def test_an_action_a_holder_sent_and_claims_again_after_a_failure_is_not_sent_twice(
    store: ConnectionStore,
) -> None:
    # The claim of this holder itself, with nothing running (its run failed before recording how it
    # ended): the action may have been written, so it is not sent again either.
    connection = RecordingConnection("holder")
    router = ActionRouter(store, timeout=5.0)
    async with holding(store, "worker-a", connection) as lease:
        claim = await store.claim_action("onebot", "qq1", "api", lease.owner, "out-8:0")
        assert claim.kind == "run"
        assert (await store.claim_action("onebot", "qq1", "api", lease.owner, "out-8:0")).kind == "mine"
        answer = await router.call(BOT, "send_group_msg", {"group_id": 1, "message": []}, "out-8:0")
    assert answer.error == "outcome_unknown" and answer.final and connection.calls == []


async def test_a_written_action_without_response_is_final_and_an_unwritten_one_runs_again(
    store: ConnectionStore,
) -> None:
    unknown = ActionAnswer(error="outcome_unknown", detail="the socket closed before the response", final=True)
    unwritten = ActionAnswer(error="not_connected", detail="ClientConnectionResetError")
    connection = RecordingConnection("holder", answers=[unwritten, unknown])
    router = ActionRouter(store, timeout=5.0)
    params = {"group_id": 1, "message": []}
    async with holding(store, "worker-a", connection):
        first = await router.call(BOT, "send_group_msg", params, "out-9:0")
        assert first.error == "not_connected" and not first.final
        second = await router.call(BOT, "send_group_msg", params, "out-9:0")  # nothing written: sent
        assert second.error == "outcome_unknown" and second.final
        third = await router.call(BOT, "send_group_msg", params, "out-9:0")  # written: never again
        assert third == second
    assert len(connection.calls) == 2


async def test_the_platform_dead_letters_an_outcome_unknown_and_retries_no_holder(store: ConnectionStore) -> None:
    """Egress's view (`OneBotPlatform.send` over the router): `outcome_unknown` is permanent (the
    record is dead-lettered, never posted twice); no holder is retried."""
    platform = OneBotPlatform()
    platform.bind(ActionRouter(store, timeout=0.5))
    held = BotConfig(platform="onebot", bot_id="qq1", transport="ws-forward")
    message = outbound([{"type": "text", "data": {"text": "hi"}}], chat_id="group_123456")
    [call] = platform.render(held, message)
    async with httpx.AsyncClient() as http:
        nobody = await platform.send(held, call, http, load_media)
        assert nobody.status == "retry" and nobody.reason == "no_holder"
        unknown = ActionAnswer(error="outcome_unknown", detail="no response within 50 s", final=True)
        connection = RecordingConnection("holder", answers=[unknown])
        async with holding(store, "worker-a", connection):
            outcome = await platform.send(held, call, http, load_media)
    assert outcome.status == "permanent" and outcome.reason == "outcome_unknown"
    assert len(connection.calls) == 1
