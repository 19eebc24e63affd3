"""`SWITCHBOARD_HOP_STAMPS`: what the stage runner and the outputs stamp into a record's hops, the
join of the producer's acknowledgement to the consumed record, and nothing of it when off."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from faust.types import TP, Message
from pydantic import BaseModel, Field

from pipeline import hopstamps
from pipeline.executor import KeyedExecutor
from pipeline.records import OutboundMessage, Position
from pipeline.segments import segment_list_adapter
from pipeline.stages.outputs import Outputs
from pipeline.stages.work import Remaining
from pipeline.worker.handling import Handling
from pipeline.worker.stage import Stage, StageRunner

TOPIC = "session.events"


class Event(BaseModel):
    conversation_key: str
    n: int
    hops: dict[str, float] = Field(default_factory=dict)


def outbound(hops: dict[str, float]) -> OutboundMessage:
    return OutboundMessage(
        outbound_id="out-1",
        kind="reply",
        platform="console",
        bot_id="demo",
        chat_id="c1",
        chat_type="private",
        conversation_key="console:demo:c1",
        segments=segment_list_adapter.validate_python([{"type": "text", "data": {"text": "hi"}}]),
        hops=dict(hops),
    )


def message(offset: int, key: str, hops: dict[str, float] | None = None) -> Message:
    value = Event(conversation_key=key, n=offset, hops=hops or {}).model_dump_json().encode()
    return Message(TOPIC, 0, offset, 0.0, 0, None, key.encode(), value, None, tp=TP(TOPIC, 0))


@pytest.fixture
def stamping() -> Iterator[None]:
    before = hopstamps.enabled
    hopstamps.enable(True)
    yield
    hopstamps.enable(before)


async def deliver_two(
    acks: list[int], hops: dict[str, float] | None = None
) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Two records of one conversation (carrying `hops`) through a runner whose work produces a
    reply each (as render's does); returns the hops each work saw and those of what it produced."""
    seen: list[dict[str, float]] = []
    produced: list[bytes] = []

    async def send(topic: str, key: str | None, value: bytes) -> None:
        produced.append(value)

    outputs = Outputs(send)

    async def step(records: list[Event], positions: list[Position]) -> list[Remaining]:
        def work(record: Event) -> Remaining:
            async def run() -> None:
                seen.append(dict(record.hops))
                await outputs.outbound(outbound(record.hops))

            return run

        return [work(r) for r in records]

    executor = KeyedExecutor(8, name="render")
    runner = StageRunner(
        Stage("render", TOPIC, Event, step), executor, outputs, lambda m: acks.append(m.offset), handling=Handling("t")
    )
    await runner.deliver([message(0, "k", hops), message(1, "k", hops)])
    await executor.join()
    return seen, [OutboundMessage.model_validate_json(v).hops for v in produced]


async def test_with_stamps_on_each_record_carries_its_arrival_and_the_produce_its_work_made(stamping: None) -> None:
    hopstamps.ACKS.acked(TOPIC, 0, 0, 123.0)  # the producer's ack of offset 0 came before the fetch
    acks: list[int] = []
    seen, produced = await deliver_two(acks, {"render.sent": 100.0})  # produced with stamps on
    assert acks == [0, 1]
    first, second = seen
    assert first["render.acked"] == 123.0
    # Offset 1's ack was not seen: the join waits for it (and would write it into the record's hops).
    assert "render.acked" not in second
    for hops in seen:
        assert hops["render.fetched"] <= hops["render.stepped"] <= hops["render.started"]
    assert first["render.fetched"] == second["render.fetched"]  # one fetch, one stamp
    for before, out in zip(seen, produced, strict=True):
        assert out["render.started"] == before["render.started"]
        assert out["egress.sent"] >= out["render.started"]
    hopstamps.ACKS.acked(TOPIC, 0, 1, 456.0)
    assert len(hopstamps.ACKS) == 0  # joined, and nothing left over


async def test_a_record_produced_without_stamps_is_not_waited_for_in_the_join(stamping: None) -> None:
    """A record from outside (the bench's filtered drain produces straight into the topic): its
    producer's acknowledgement never comes here, so it does not take a place in the join."""
    seen, _ = await deliver_two([])
    assert all("render.fetched" in hops and "render.acked" not in hops for hops in seen)
    assert len(hopstamps.ACKS) == 0


async def test_without_stamps_the_hops_are_left_as_they_were() -> None:
    assert not hopstamps.enabled
    seen, produced = await deliver_two([])
    assert seen == [{}, {}]
    assert produced == [{}, {}]


async def test_a_task_the_work_spawns_does_not_pass_for_the_work(stamping: None) -> None:
    hops: dict[str, float] = {}
    spawned: dict[str, float] = {}
    with hopstamps.working("dispatch", hops):
        # A stream reader started from dispatch's work produces later, for itself.
        task = asyncio.create_task(_send_later(spawned))
        mine: dict[str, float] = {}
        hopstamps.sent(mine, "egress")
    await task
    assert set(mine) == {"dispatch.started", "egress.sent"}
    assert set(spawned) == {"render.sent"}


async def _send_later(hops: dict[str, float]) -> None:
    await asyncio.sleep(0)
    hopstamps.sent(hops, "render")


def test_the_ack_join_writes_the_stamp_whichever_side_comes_second() -> None:
    join = hopstamps.AckJoin()
    early: dict[str, float] = {}
    join.read("t", 1, 7, early, "ingest.acked")  # fetched first
    join.acked("t", 1, 7, 10.0)
    late: dict[str, float] = {}
    join.acked("t", 1, 8, 11.0)  # acknowledged first
    join.read("t", 1, 8, late, "ingest.acked")
    assert early == {"ingest.acked": 10.0} and late == {"ingest.acked": 11.0}
    assert len(join) == 0


def test_the_ack_join_keeps_at_most_its_limit_dropping_the_oldest() -> None:
    join = hopstamps.AckJoin(limit=2)
    for offset in range(3):  # consumed by another worker: never joined
        join.acked("t", 0, offset, float(offset))
    assert len(join) == 2
    gone: dict[str, float] = {}
    join.read("t", 0, 0, gone, "x")
    kept: dict[str, float] = {}
    join.read("t", 0, 2, kept, "x")
    assert kept == {"x": 2.0} and gone == {}


async def test_a_delivery_callback_records_the_ack_of_a_produced_record() -> None:
    join = hopstamps.AckJoin()
    delivery: asyncio.Future[SimpleNamespace] = asyncio.get_running_loop().create_future()
    delivery.set_result(SimpleNamespace(topic="t", partition=2, offset=5))
    join.on_delivery(delivery)
    failed: asyncio.Future[SimpleNamespace] = asyncio.get_running_loop().create_future()
    failed.set_exception(RuntimeError("not stored"))
    join.on_delivery(failed)
    failed.exception()  # retrieved: no "never retrieved" warning
    hops: dict[str, float] = {}
    join.read("t", 2, 5, hops, "dispatch.acked")
    assert set(hops) == {"dispatch.acked"}
    assert len(join) == 0
