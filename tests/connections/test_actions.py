"""Actions asked for by any worker, run by the holder, through a real Redis: answered over the
queue, `no_holder` / `timeout` when nobody answers, a request asked for again answered and not run
twice, and a holder whose lease was taken giving the request back for the new holder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from pipeline import metrics
from pipeline.connections import ActionRouter
from pipeline.connections._actions import ActionServer
from pipeline.connections._lease import HeldLease
from pipeline.connections.base import ActionAnswer, Connection, Link
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore

BOT = BotConfig(platform="onebot", bot_id="qq1", transport="ws-forward")


class RecordingConnection(Connection):
    """A connection whose actions are recorded and answered after `delay`."""

    transport = "ws-forward"
    channels = frozenset({"api", "event"})

    def __init__(self, name: str, delay: float = 0.0, final: bool = True) -> None:
        self.name = name
        self.delay = delay
        self.final = final
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def run(self, link: Link) -> None:
        await asyncio.Event().wait()

    async def call(self, action: str, params: Mapping[str, Any], timeout: float) -> ActionAnswer:
        self.calls.append((action, dict(params)))
        await asyncio.sleep(self.delay)
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
    server = asyncio.create_task(ActionServer(store, BOT, connection, lease, stop).serve())
    try:
        yield lease
    finally:
        stop.set()
        await server
        await lease.release()


def _count(outcome: str) -> float:
    return metrics.CONNECTION_ACTIONS.labels("onebot", outcome)._value.get()


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
    assert len(connection.calls) == 1


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
        server = asyncio.create_task(ActionServer(store, BOT, new, new_lease, stop).serve())
        answer = await call
        stop.set()
        await server
        await new_lease.release()
    assert answer.response is not None and answer.response["by"] == "new"
    assert old.calls == [] and len(new.calls) == 1
