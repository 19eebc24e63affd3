"""Keyed executor, deferred tails (`defer`): a key's next work starts while an earlier work's
last wait (the broker's acknowledgement) is still running, yet acks stay in offset order per
partition and a record is acknowledged only once its tail is done."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from pipeline.executor import KeyedExecutor, defer, work_revoked
from pipeline.executor.keyed import Ack
from pipeline.stages.outputs import Outputs
from pipeline.worker.handling import Handling


def acker(acked: list[int], i: int) -> Ack:
    return cast(Ack, lambda: acked.append(i))


async def settle() -> None:
    """Let every ready task run until none is (no timing: the loop has nothing else to do)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_keys_next_work_runs_while_the_earlier_tail_waits_and_acks_wait_for_the_tail() -> None:
    executor = KeyedExecutor(max_in_flight=4)
    ran: list[int] = []
    acked: list[int] = []
    delivered = asyncio.Event()

    def make(i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            ran.append(i)
            if i == 0:
                assert defer(delivered.wait)

        return work

    for i in range(3):
        await executor.submit("chat", make(i), partition=0, offset=i, ack=acker(acked, i))
    await settle()
    assert ran == [0, 1, 2]  # the key did not wait for the tail
    assert acked == []  # but nothing passes the unfinished record 0
    assert executor.pending == 3
    assert executor.deferred == 1
    delivered.set()
    await executor.join()
    assert acked == [0, 1, 2]
    assert executor.pending == 0
    assert executor.deferred == 0


async def test_work_order_per_key_and_ack_order_per_partition_hold_with_random_tails() -> None:
    executor = KeyedExecutor(max_in_flight=3, max_pending=1000)  # the test sets tails only as it goes
    ran: dict[str, list[int]] = {}
    acked: dict[int, list[int]] = {0: [], 1: []}
    gates: list[asyncio.Event] = []
    submitted: dict[str, list[int]] = {}

    def make(key: str, i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            ran.setdefault(key, []).append(i)
            gate = asyncio.Event()
            gates.append(gate)
            assert defer(gate.wait)

        return work

    rng = random.Random(35)
    offsets = {0: 0, 1: 0}
    for i in range(200):
        key = f"chat-{rng.randrange(5)}"
        partition = hash(key) % 2
        offset = offsets[partition]
        offsets[partition] += 1
        submitted.setdefault(key, []).append(i)
        await executor.submit(
            key,
            make(key, i),
            partition=partition,
            offset=offset,
            ack=cast(Ack, lambda p=partition, o=offset: acked[p].append(o)),
        )
        if rng.random() < 0.3:  # finish some tails out of order along the way
            for gate in rng.sample(gates, k=min(len(gates), 3)):
                gate.set()
            await settle()
    while executor.deferred or executor.pending:
        for gate in gates:
            gate.set()
        await settle()
    await executor.join()
    assert ran == submitted
    assert acked[0] == list(range(offsets[0]))
    assert acked[1] == list(range(offsets[1]))


async def test_deferred_tails_count_as_pending_so_the_bound_still_applies() -> None:
    executor = KeyedExecutor(max_in_flight=4, max_pending=2)
    delivered = asyncio.Event()

    async def work() -> None:
        defer(delivered.wait)

    await executor.submit("chat", work, offset=0)
    await executor.submit("chat", work, offset=1)
    third = asyncio.create_task(executor.submit("chat", work, offset=2))
    await settle()
    assert not third.done()  # the consumer would stop fetching here, as with unfinished work
    delivered.set()
    await third
    await executor.join()
    assert executor.pending == 0


async def test_a_failing_tail_is_reported_and_released_without_stalling_the_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors: list[BaseException] = []
    executor = KeyedExecutor(max_in_flight=2, on_error=lambda _ticket, exc: errors.append(exc))
    acked: list[int] = []

    async def broken() -> None:
        raise RuntimeError("broker refused")

    async def work() -> None:
        defer(broken)

    async def fine() -> None:
        return None

    await executor.submit("chat", work, offset=0, ack=acker(acked, 0))
    await executor.submit("chat", fine, offset=1, ack=acker(acked, 1))
    await executor.join()
    assert acked == [0, 1]
    assert [str(e) for e in errors] == ["broker refused"]
    assert "unhandled error" in caplog.text


async def test_handling_dead_letters_a_record_whose_tail_fails() -> None:
    executor = KeyedExecutor(max_in_flight=2)
    handling = Handling("ingest")
    letters: list[tuple[str, str]] = []
    acked: list[int] = []

    async def dead_letter(reason: str, error: str) -> None:
        letters.append((reason, error))

    async def broken() -> None:
        raise RuntimeError("not delivered")

    async def work() -> None:
        defer(broken)

    await executor.submit("chat", lambda: handling.run(work, dead_letter), offset=0, ack=acker(acked, 0))
    await executor.join()
    assert letters == [("handler_error", "RuntimeError('not delivered')")]
    assert acked == [0]


async def test_a_revoked_partitions_tail_finishes_but_its_ack_does_not_run() -> None:
    executor = KeyedExecutor(max_in_flight=2)
    acked: list[int] = []
    revoked_in_tail: list[bool] = []
    delivered = asyncio.Event()

    async def tail() -> None:
        await delivered.wait()
        revoked_in_tail.append(work_revoked())

    async def work() -> None:
        defer(tail)

    await executor.submit("chat", work, partition="p0", offset=0, ack=acker(acked, 0))
    await settle()
    assert executor.drop_partitions({"p0"}) == 1
    delivered.set()
    await executor.join()
    assert acked == []
    assert revoked_in_tail == [True]
    assert executor.pending == 0


async def test_defer_outside_a_keys_work_is_refused() -> None:
    async def tail() -> None:
        return None

    assert defer(tail) is False


class _Broker:
    """A send that buffers: each record's acknowledgement is a future the test resolves."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.acks: list[asyncio.Future[None]] = []

    async def send(self, topic: str, key: str | None, value: bytes) -> Any:
        self.sent.append((topic, value))
        ack: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        return ack


async def test_outputs_wait_for_the_broker_outside_the_key_and_ack_after_it() -> None:
    broker = _Broker()
    outputs = Outputs(broker.send)
    executor = KeyedExecutor(max_in_flight=2)
    acked: list[int] = []

    def make(i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            outputs.begin()
            await outputs.dead_letter("ingest", f"r{i}", "{}")
            await outputs.delivered_outside_key()

        return work

    for i in range(3):
        await executor.submit("chat", make(i), offset=i, ack=acker(acked, i))
    await settle()
    assert len(broker.sent) == 3  # produced in the key's order, none waiting for the broker
    assert [b'"reason":"r0"' in v for _, v in broker.sent] == [True, False, False]
    assert acked == []
    broker.acks[1].set_result(None)
    broker.acks[2].set_result(None)
    await settle()
    assert acked == []  # 0 is not acknowledged by the broker yet
    broker.acks[0].set_result(None)
    await executor.join()
    assert acked == [0, 1, 2]


async def test_outputs_outside_an_executor_wait_inline() -> None:
    broker = _Broker()
    outputs = Outputs(broker.send)
    outputs.begin()
    await outputs.dead_letter("ingest", "r", "{}")
    waiting = asyncio.create_task(outputs.delivered_outside_key())
    await settle()
    assert not waiting.done()
    broker.acks[0].set_result(None)
    await waiting


async def test_a_task_the_work_started_cannot_defer_once_the_work_has_returned() -> None:
    """A background task copies the work's context; deferring from it after the work returned
    would leave a wait nobody runs, so it is refused (the task waits itself)."""
    executor = KeyedExecutor(max_in_flight=2)
    later = asyncio.Event()
    refused: list[bool] = []
    acked: list[int] = []

    async def background() -> None:
        await later.wait()

        async def tail() -> None:
            return None

        refused.append(not defer(tail))

    async def work() -> None:
        asyncio.get_running_loop().create_task(background())

    await executor.submit("chat", work, offset=0, ack=acker(acked, 0))
    await executor.join()
    assert acked == [0]
    later.set()
    await settle()
    assert refused == [True]
