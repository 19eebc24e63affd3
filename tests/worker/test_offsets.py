"""How far the worker's consumer may commit a partition (`PartitionProgress`): never past a record
no stage acknowledged, never held up by offsets the log does not have."""

from __future__ import annotations

from faust.types import Message

from pipeline.worker.offsets import PartitionProgress


def record(offset: int) -> Message:
    return Message("t", 0, offset, 0.0, 0, None, b"k", b"v", None)


def deliver(progress: PartitionProgress, *offsets: int) -> dict[int, Message]:
    delivered = {}
    for offset in offsets:
        assert progress.accepts(offset)
        message = delivered[offset] = record(offset)
        progress.delivered(message)
    return delivered


def test_acknowledged_records_in_order_are_committed_up_to_the_next_one() -> None:
    progress = PartitionProgress()
    delivered = deliver(progress, 0, 1, 2)
    assert progress.to_commit() is None  # nothing acknowledged yet
    assert progress.ack(delivered[0]) and progress.ack(delivered[1])
    assert progress.to_commit() == 2
    assert progress.read == 2
    progress.committed = 2
    assert progress.to_commit() is None  # a commit never repeats or goes back
    assert progress.ack(delivered[2])
    assert progress.to_commit() == 3
    assert not progress.ack(delivered[2])  # acknowledged before


def test_offsets_missing_from_the_log_do_not_hold_commits() -> None:
    # 6 and 9 are not in the log (a transaction marker, a compacted record): never delivered.
    progress = PartitionProgress(committed=5, next_offset=5)
    for message in deliver(progress, 5, 7, 8, 10).values():
        assert progress.ack(message)
    assert progress.to_commit() == 11
    assert not progress.held


def test_a_record_no_stage_acknowledged_holds_the_commit_until_it_is_read_again() -> None:
    progress = PartitionProgress(committed=5, next_offset=5)
    first = deliver(progress, 5, 6, 7)
    assert progress.ack(first[6]) and progress.ack(first[7])  # 5 was handed to no stage
    assert progress.held
    assert progress.to_commit() is None
    assert progress.first_unacknowledged == 5
    progress.seek(5)
    assert not progress.held
    assert progress.read == 4
    assert not progress.ack(first[5])  # a delivery before the seek no longer counts
    again = deliver(progress, 5, 6, 7)
    assert all(progress.ack(message) for message in again.values())
    assert progress.to_commit() == 8


def test_the_first_record_counts_before_any_commit() -> None:
    # Nothing committed, the log starting at 3: a record left unacknowledged there holds too.
    progress = PartitionProgress()
    delivered = deliver(progress, 3, 4)
    assert progress.ack(delivered[4])
    assert progress.held and progress.to_commit() is None
    assert progress.ack(delivered[3])
    assert progress.to_commit() == 5 and not progress.held


def test_records_read_before_a_seek_back_wait_for_the_replay() -> None:
    progress = PartitionProgress()
    first = deliver(progress, 0, 1, 2, 3)
    assert progress.ack(first[0])
    progress.seek(1)
    assert not progress.accepts(0)  # fetched before the seek
    assert progress.accepts(1)
    again = deliver(progress, 1)
    assert not progress.accepts(1)
    assert [m.offset for m in progress.unacknowledged] == [1]
    assert not progress.ack(first[1])
    assert progress.ack(again[1])
    assert progress.to_commit() == 2


def test_an_acknowledgement_of_a_record_not_delivered_is_ignored() -> None:
    progress = PartitionProgress()
    assert not progress.ack(record(0))
    deliver(progress, 0, 2)
    assert not progress.ack(record(0))  # a record of the same offset, not the one delivered
    assert not progress.ack(record(1))  # not in the log, so never delivered
    assert progress.to_commit() is None
