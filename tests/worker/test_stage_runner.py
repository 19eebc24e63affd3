"""The stage runner: parse once, one batch step, remaining work per conversation, acks in offset
order per partition, one dead-letter path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from faust.types import TP, Message
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError

from pipeline.executor import KeyedExecutor
from pipeline.records import DeadLetter, Position
from pipeline.stages.outputs import Outputs
from pipeline.stages.work import Remaining, SharedWork, Work
from pipeline.worker.handling import Handling
from pipeline.worker.stage import Stage, StageRunner

TOPIC = "t.in"


class Item(BaseModel):
    conversation_key: str
    n: int


class Produced:
    """Outputs bound to a list (what the app binds to the producer)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str | None, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, key, value))

    def dead_letters(self) -> list[DeadLetter]:
        return [DeadLetter.model_validate_json(v) for t, _, v in self.records if t == "im.deadletter"]


def message(offset: int, value: bytes, partition: int = 0) -> Message:
    tp = TP(TOPIC, partition)
    return Message(TOPIC, partition, offset, 0.0, 0, None, b"k", value, None, tp=tp)


def item(offset: int, key: str, partition: int = 0) -> Message:
    return message(offset, Item(conversation_key=key, n=offset).model_dump_json().encode(), partition)


async def no_sleep(_: float) -> None:
    await asyncio.sleep(0)


def runner(
    step: Any, acked: list[int], ack: Callable[[Message], Any] | None = None
) -> tuple[StageRunner[Item], Produced, KeyedExecutor]:
    produced = Produced()
    executor = KeyedExecutor(8, name="test")
    stage = Stage("test", TOPIC, Item, step)
    return (
        StageRunner(
            stage,
            executor,
            Outputs(produced),
            ack or (lambda m: acked.append(m.offset)),
            handling=Handling("test", sleep=no_sleep),
        ),
        produced,
        executor,
    )


async def test_settled_records_ack_at_once_and_work_acks_in_offset_order() -> None:
    acked: list[int] = []
    ran: list[int] = []
    release = asyncio.Event()
    seen_positions: list[Position] = []

    async def step(records: list[Item], positions: list[Position]) -> list[Work | None]:
        seen_positions.extend(positions)

        def work(n: int) -> Work:
            async def run() -> None:
                if n == 1:
                    await release.wait()  # the slow conversation holds back offsets after it
                ran.append(n)

            return run

        return [work(r.n) if r.n % 2 else None for r in records]

    stage_runner, _, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a"), item(1, "slow"), item(2, "b"), item(3, "c")])
    await asyncio.sleep(0.01)
    assert ran == [3]  # other conversations are not held up by the slow one
    assert acked == [0]  # but no offset passes unfinished work
    release.set()
    await executor.join()
    assert sorted(ran) == [1, 3]
    assert acked == [0, 1, 2, 3]
    assert [p.offset for p in seen_positions] == [0, 1, 2, 3]


async def test_an_invalid_record_is_dead_lettered_and_acknowledged_in_its_place() -> None:
    acked: list[int] = []

    async def step(records: list[Item], positions: list[Position]) -> list[Work | None]:
        return [None for _ in records]

    stage_runner, produced, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a"), message(1, b'{"conversation_key": 5}'), item(2, "a")])
    await executor.join()
    assert acked == [0, 1, 2]
    (letter,) = produced.dead_letters()
    assert (letter.stage, letter.reason, letter.offset, letter.topic) == ("test", "invalid_record", 1, TOPIC)
    assert letter.record == '{"conversation_key": 5}'


async def test_a_failing_batch_step_falls_back_to_one_record_at_a_time() -> None:
    acked: list[int] = []
    handled: list[int] = []

    async def step(records: list[Item], positions: list[Position]) -> list[Work | None]:
        if any(r.n == 1 for r in records):
            raise ValueError("record 1 breaks the step")

        async def run() -> None:
            handled.extend(r.n for r in records)

        return [run for _ in records]

    stage_runner, produced, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a"), item(1, "b"), item(2, "c")])
    await executor.join()
    assert sorted(handled) == [0, 2]  # the others still handled
    assert acked == [0, 1, 2]
    (letter,) = produced.dead_letters()
    assert (letter.reason, letter.offset) == ("handler_error", 1)
    assert "record 1 breaks the step" in letter.error


async def test_transient_failures_are_retried_not_dead_lettered() -> None:
    acked: list[int] = []
    calls = {"step": 0, "work": 0}

    async def step(records: list[Item], positions: list[Position]) -> list[Work | None]:
        calls["step"] += 1
        if calls["step"] < 3:
            raise RedisConnectionError("restarting")

        async def run() -> None:
            calls["work"] += 1
            if calls["work"] < 2:
                raise RedisConnectionError("restarting")

        return [run]

    stage_runner, produced, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a")])
    await executor.join()
    assert calls == {"step": 3, "work": 2}
    assert acked == [0]
    assert produced.dead_letters() == []


@pytest.mark.parametrize("results", [0, 2])
async def test_a_step_returning_the_wrong_number_of_results_is_handled_record_by_record(results: int) -> None:
    acked: list[int] = []

    async def step(records: list[Item], positions: list[Position]) -> list[Work | None]:
        return [None] * (results if len(records) > 1 else 1)

    stage_runner, produced, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a"), item(1, "b"), item(2, "c")])
    await executor.join()
    assert acked == [0, 1, 2]
    assert produced.dead_letters() == []


async def test_records_of_a_shared_work_ack_once_it_is_done_and_the_next_batch_goes_on() -> None:
    acked: list[int] = []
    admitted = asyncio.Event()
    runs = 0

    async def admission() -> None:
        nonlocal runs
        runs += 1
        await admitted.wait()

    shared = SharedWork(admission)

    async def step(records: list[Item], positions: list[Position]) -> list[Remaining]:
        return [shared if r.n < 3 else None for r in records]

    stage_runner, _, executor = runner(step, acked)
    # The deliveries return while the shared work waits: the next batch is not held up by it.
    await asyncio.wait_for(stage_runner.deliver([item(0, "a"), item(1, "b"), item(2, "a")]), 1)
    await asyncio.wait_for(stage_runner.deliver([item(3, "a"), item(4, "c")]), 1)
    await asyncio.sleep(0.02)
    assert acked == [] and runs == 1  # run once for the three; no ack passes them
    assert executor.pending == 3  # the three held records share one ticket; then 3 and 4
    admitted.set()
    await executor.join()
    assert acked == [0, 1, 2, 3, 4]


async def test_held_records_share_a_ticket_per_run_and_still_ack_in_offset_order() -> None:
    """Records of one shared work held back to back on a partition share a ticket; a record of the
    same partition with another fate in between starts a new run, and acks stay in offset order."""
    acked: list[tuple[int, int]] = []
    admitted = asyncio.Event()

    async def admission() -> None:
        await admitted.wait()

    shared = SharedWork(admission)

    async def step(records: list[Item], positions: list[Position]) -> list[Remaining]:
        return [None if r.conversation_key == "settled" else shared for r in records]

    stage_runner, _, executor = runner(step, [], lambda m: acked.append((m.partition, m.offset)))
    batch = [
        item(0, "a", partition=0),
        item(0, "a", partition=1),
        item(1, "b", partition=0),
        item(2, "settled", partition=0),  # ends partition 0's first run
        item(1, "c", partition=1),
        item(3, "a", partition=0),
        item(4, "b", partition=0),
    ]
    await stage_runner.deliver(batch)
    # Partition 0: a run of 0-1, the settled 2, a run of 3-4; partition 1: one run of 0-1.
    assert executor.pending == 4
    await asyncio.sleep(0.01)
    assert acked == []  # the settled record waits behind the run before it
    admitted.set()
    await executor.join()
    assert [o for p, o in acked if p == 0] == [0, 1, 2, 3, 4]
    assert [o for p, o in acked if p == 1] == [0, 1]
    assert executor.pending == 0


async def test_a_failed_shared_work_sends_its_records_through_the_step_one_at_a_time() -> None:
    acked: list[int] = []
    alone: list[list[int]] = []

    async def fails() -> None:
        raise ConnectionError("the connection dropped mid-call")

    shared = SharedWork(fails)

    async def step(records: list[Item], positions: list[Position]) -> list[Remaining]:
        if len(records) > 1:
            return [shared for _ in records]
        alone.append([r.n for r in records])
        if records[0].n == 1:
            raise ValueError("record 1 breaks the step")
        return [None]

    stage_runner, produced, executor = runner(step, acked)
    await stage_runner.deliver([item(0, "a"), item(1, "b"), item(2, "a")])
    await executor.join()
    assert alone == [[0], [1], [2]]  # in offset order
    assert acked == [0, 1, 2]
    (letter,) = produced.dead_letters()
    assert (letter.reason, letter.offset) == ("handler_error", 1)
