"""The SIGTERM drain: intake paused, then wait for quiet, bounded."""

from __future__ import annotations

from collections.abc import Iterable

from faust.types import TP

from pipeline.worker.drain import Drain


class Consumer:
    def __init__(self, assigned: set[TP], highwater: dict[TP, int], read: dict[TP, int]) -> None:
        self.assigned = assigned
        self.highwaters = highwater
        self.read = read
        self.paused: set[TP] = set()

    def assignment(self) -> set[TP]:
        return self.assigned

    def highwater(self, tp: TP) -> int | None:
        return self.highwaters.get(tp)

    def read_offset(self, tp: TP) -> int | None:
        return self.read.get(tp)

    def pause_partitions(self, tps: Iterable[TP]) -> None:
        self.paused |= set(tps)


INBOUND, EVENTS = TP("im.inbound", 0), TP("session.events", 0)


async def test_intake_is_paused_and_the_drain_ends_once_quiet() -> None:
    consumer = Consumer({INBOUND, EVENTS}, {EVENTS: 10}, {EVENTS: 9})
    busy = iter([True, True, False, False, False, False])
    drain = Drain(
        consumer, frozenset({"im.inbound"}), busy=lambda: next(busy, False), quiet_seconds=0.02, poll_seconds=0.01
    )
    assert await drain.run(5.0) is True
    assert consumer.paused == {INBOUND}


async def test_unread_records_downstream_keep_the_drain_waiting_until_its_time_is_over() -> None:
    consumer = Consumer({INBOUND, EVENTS}, {EVENTS: 20}, {EVENTS: 9})  # 10 records not read yet
    drain = Drain(consumer, frozenset({"im.inbound"}), busy=lambda: False, quiet_seconds=0.01, poll_seconds=0.01)
    assert drain.unread_downstream()
    assert await drain.run(0.1) is False
    consumer.read[EVENTS] = 19
    assert not drain.unread_downstream()


def test_idle_needs_an_assignment_every_record_read_and_nothing_busy() -> None:
    """`switchboard_worker_idle` (what tests and the bench wait on): unread records on any topic,
    intake included, pending work or no assignment at all each mean "not idle"."""
    consumer = Consumer(set(), {}, {})
    busy = False
    drain = Drain(consumer, frozenset({"im.inbound"}), busy=lambda: busy)
    assert not drain.idle()  # nothing assigned yet: records may be waiting unseen
    consumer.assigned = {INBOUND, EVENTS}
    consumer.highwaters, consumer.read = {INBOUND: 5, EVENTS: 3}, {INBOUND: 3, EVENTS: 2}
    assert not drain.idle()  # a record of the intake topic not read yet
    assert not drain.unread_downstream()  # which the SIGTERM drain does not wait for
    consumer.read[INBOUND] = 4
    assert drain.idle()
    busy = True
    assert not drain.idle()
