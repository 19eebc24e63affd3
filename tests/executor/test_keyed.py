"""Keyed executor: per-key FIFO, global bound, acks in offset order per partition."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import cast

import pytest

from pipeline.executor import KeyedExecutor, work_revoked
from pipeline.executor.keyed import Ack


async def test_work_for_one_key_runs_in_submission_order() -> None:
    executor = KeyedExecutor(max_in_flight=8)
    seen: list[int] = []

    def make(i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            await asyncio.sleep(random.random() / 200)
            seen.append(i)

        return work

    for i in range(50):
        await executor.submit("conv-a", make(i), offset=i)
    await executor.join()
    assert seen == list(range(50))


async def test_different_keys_run_concurrently_up_to_the_bound() -> None:
    executor = KeyedExecutor(max_in_flight=3)
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def work() -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    for i in range(10):
        await executor.submit(f"k{i}", work, offset=i)
    await asyncio.sleep(0.05)
    assert peak == 3
    assert executor.in_flight == 3
    gate.set()
    await executor.join()
    assert running == 0


async def test_ack_never_passes_an_unfinished_message() -> None:
    executor = KeyedExecutor(max_in_flight=16)
    acked: list[int] = []
    gates = {i: asyncio.Event() for i in range(6)}

    def make(i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            await gates[i].wait()

        return work

    for i in range(6):
        await executor.submit(f"k{i}", make(i), partition=0, offset=i, ack=cast(Ack, lambda i=i: acked.append(i)))

    # finish 1..5 but not 0: nothing may be acked
    for i in range(1, 6):
        gates[i].set()
    await asyncio.sleep(0.05)
    assert acked == []
    gates[0].set()
    await executor.join()
    assert acked == [0, 1, 2, 3, 4, 5]


async def test_acks_of_partitions_are_independent() -> None:
    executor = KeyedExecutor(max_in_flight=16)
    acked: list[tuple[int, int]] = []
    blocker = asyncio.Event()

    async def slow() -> None:
        await blocker.wait()

    async def fast() -> None:
        return None

    await executor.submit("a", slow, partition=0, offset=0, ack=lambda: acked.append((0, 0)))
    await executor.submit("b", fast, partition=1, offset=0, ack=lambda: acked.append((1, 0)))
    await executor.submit("c", fast, partition=1, offset=1, ack=lambda: acked.append((1, 1)))
    await asyncio.sleep(0.05)
    assert acked == [(1, 0), (1, 1)]
    blocker.set()
    await executor.join()
    assert acked[-1] == (0, 0)


async def test_random_completion_order_releases_acks_in_offset_order() -> None:
    rng = random.Random(7)
    executor = KeyedExecutor(max_in_flight=32)
    acked: dict[int, list[int]] = {0: [], 1: []}
    for offset in range(200):
        partition = offset % 2

        async def work(delay: float = rng.random() / 100) -> None:
            await asyncio.sleep(delay)

        await executor.submit(
            f"k{rng.randrange(40)}",
            work,
            partition=partition,
            offset=offset,
            ack=cast(Ack, lambda p=partition, o=offset: acked[p].append(o)),
        )
    await executor.join()
    assert acked[0] == sorted(acked[0]) and len(acked[0]) == 100
    assert acked[1] == sorted(acked[1]) and len(acked[1]) == 100


async def test_a_failing_work_item_is_reported_and_does_not_stall_its_key() -> None:
    errors: list[BaseException] = []
    executor = KeyedExecutor(max_in_flight=2, on_error=lambda t, e: errors.append(e))
    done: list[int] = []

    async def boom() -> None:
        raise ValueError("bad")

    async def ok() -> None:
        done.append(1)

    await executor.submit("k", boom, offset=0)
    await executor.submit("k", ok, offset=1)
    await executor.join()
    assert [type(e) for e in errors] == [ValueError]
    assert done == [1]


async def test_submit_waits_when_too_much_is_pending() -> None:
    executor = KeyedExecutor(max_in_flight=1, max_pending=2)
    gate = asyncio.Event()

    async def work() -> None:
        await gate.wait()

    await executor.submit("a", work, offset=0)
    await executor.submit("b", work, offset=1)
    third = asyncio.create_task(executor.submit("c", work, offset=2))
    await asyncio.sleep(0.05)
    assert not third.done()
    gate.set()
    await asyncio.wait_for(third, 1)
    await executor.join()


async def test_dropped_partition_acks_do_not_run_and_queued_work_is_skipped() -> None:
    executor = KeyedExecutor(max_in_flight=4)
    acked: list[int] = []
    ran: list[int] = []
    gate = asyncio.Event()

    def make(i: int) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            ran.append(i)
            await gate.wait()

        return work

    for i in range(3):
        await executor.submit("same", make(i), partition=5, offset=i, ack=cast(Ack, lambda i=i: acked.append(i)))
    await asyncio.sleep(0.02)
    assert executor.drop_partitions({5}) == 3
    gate.set()
    await executor.join()
    assert ran == [0]
    assert acked == []
    assert executor.pending == 0


async def test_running_work_learns_that_its_partition_was_revoked() -> None:
    """A call that fails after a rebalance must not tell the chat: the new owner replays it."""
    executor = KeyedExecutor(max_in_flight=4)
    seen: dict[str, list[bool]] = {"a": [], "b": []}
    gate = asyncio.Event()

    def make(key: str) -> Callable[[], Awaitable[None]]:
        async def work() -> None:
            seen[key].append(work_revoked())
            await gate.wait()  # the session call, during which the partition moves
            seen[key].append(work_revoked())

        return work

    await executor.submit("a", make("a"), partition=1, offset=0)
    await executor.submit("b", make("b"), partition=2, offset=0)
    await asyncio.sleep(0.02)
    executor.drop_partitions({1})
    gate.set()
    await executor.join()
    assert seen == {"a": [False, True], "b": [False, False]}
    assert not work_revoked()  # outside any work


@pytest.mark.parametrize("max_in_flight", [0, -1])
def test_invalid_bound_is_rejected(max_in_flight: int) -> None:
    with pytest.raises(ValueError):
        KeyedExecutor(max_in_flight=max_in_flight)


async def test_inline_handled_messages_wait_for_earlier_offsets() -> None:
    executor = KeyedExecutor(max_in_flight=4)
    acked: list[int] = []
    gate = asyncio.Event()

    async def slow() -> None:
        await gate.wait()

    await executor.submit("k", slow, partition=0, offset=0, ack=lambda: acked.append(0))
    executor.submit_done(partition=0, offset=1, ack=lambda: acked.append(1))
    await asyncio.sleep(0.02)
    assert acked == []
    gate.set()
    await executor.join()
    assert acked == [0, 1]
    executor.submit_done(partition=0, offset=2, ack=lambda: acked.append(2))
    assert acked == [0, 1, 2]  # nothing ahead of it: acknowledged at once


async def test_held_records_are_acked_in_offset_order_once_their_group_work_is_done() -> None:
    executor = KeyedExecutor(max_in_flight=8)
    acked: list[int] = []
    gate = asyncio.Event()

    def ack(i: int) -> Ack:
        return cast(Ack, lambda: acked.append(i))

    # Offsets 0..4 of one partition: 0 and 3 handled inline, 1, 2 and 4 settled by one group work.
    executor.submit_done(partition=0, offset=0, ack=ack(0))
    held = [executor.hold(partition=0, offset=1, ack=ack(1)), executor.hold(partition=0, offset=2, ack=ack(2))]
    executor.submit_done(partition=0, offset=3, ack=ack(3))
    held.append(executor.hold(partition=0, offset=4, ack=ack(4)))
    assert executor.pending == 4
    await executor.settle_group(held, gate.wait)  # returns at once: the work runs in a task
    await asyncio.sleep(0.05)
    assert acked == [0]  # nothing past the held offset 1
    gate.set()
    await executor.join()  # joins the group work too
    assert acked == [0, 1, 2, 3, 4]
    assert executor.pending == 0


async def test_a_failing_group_work_is_logged_and_still_releases_its_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    executor = KeyedExecutor(max_in_flight=8, name="grp")
    acked: list[int] = []

    async def fails() -> None:
        raise RuntimeError("a bug")

    held = [executor.hold(partition=0, offset=i, ack=cast(Ack, lambda i=i: acked.append(i))) for i in range(3)]
    await executor.settle_group(held, fails)
    await executor.join()
    assert acked == [0, 1, 2]
    assert all(isinstance(t.error, RuntimeError) for t in held)
    assert "grp: unhandled error in a group's work" in caplog.text


async def test_group_works_are_bounded_and_a_revoked_group_acks_nothing() -> None:
    executor = KeyedExecutor(max_in_flight=8, max_groups=2)
    acked: list[tuple[int, int]] = []
    gates = [asyncio.Event() for _ in range(3)]
    for g in range(3):
        held = [
            executor.hold(partition=g, offset=i, ack=cast(Ack, lambda g=g, i=i: acked.append((g, i)))) for i in range(2)
        ]
        submitting = asyncio.ensure_future(executor.settle_group(held, gates[g].wait))
        await asyncio.sleep(0.02)
        # The third waits until one of the two running finishes: the stage stops fetching meanwhile.
        assert submitting.done() == (g < 2)
    assert executor.drop_partitions({0}) == 2
    gates[0].set()
    await asyncio.sleep(0.02)
    assert submitting.done()  # room again
    gates[1].set()
    gates[2].set()
    await executor.join()
    assert sorted(acked) == [(1, 0), (1, 1), (2, 0), (2, 1)]  # partition 0's new owner replays its two
    assert executor.pending == 0
