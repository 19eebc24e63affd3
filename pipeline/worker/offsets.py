"""Where the worker's consumer stands in each assigned partition, and how far it may commit.

Records are delivered to the stages in offset order per partition, and the stages acknowledge them
in that order (a record once it and every earlier record of its partition are done). The offset to
commit is the one after the last acknowledged record before which every delivered record was
acknowledged: it never passes unfinished work, and never a record that no stage was handed.
Offsets the log does not have (compacted or deleted records, transaction markers) were never
delivered, so they hold nothing up.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from faust.types import Message


@dataclass(eq=False)
class PartitionProgress:
    """One assigned partition: what was read, acknowledged and committed."""

    # The last offset committed (Kafka's meaning: the next record to read), None before the first.
    committed: int | None = None
    # The last offset delivered, or the one before a seek's target (None: nothing read yet).
    read: int | None = None
    # The lowest offset the next record may have: a record below it was read before a seek back
    # and comes again with the replay (None: whatever the fetch starts at).
    next_offset: int | None = None
    # The offset after the last record acknowledged with every record delivered before it.
    acknowledged: int | None = None
    # Delivered and not yet acknowledged, in offset order.
    pending: deque[Message] = field(default_factory=deque)
    # Acknowledged while an earlier delivered record is not (never, while stages acknowledge in
    # order and every delivered record reaches a stage).
    acked_ahead: set[int] = field(default_factory=set)

    def accepts(self, offset: int) -> bool:
        """Whether a fetched record is the next to deliver (not one read before a seek back)."""
        return self.next_offset is None or offset >= self.next_offset

    def delivered(self, message: Message) -> None:
        self.pending.append(message)
        self.read = message.offset
        self.next_offset = message.offset + 1

    def ack(self, message: Message) -> bool:
        """Record `message` as acknowledged; False when it is not a pending delivery (acknowledged
        before, or delivered before a seek that forgot it: its replay is what counts)."""
        pending = self.pending
        if not pending:
            return False
        if pending[0] is not message:
            offset = message.offset
            if offset in self.acked_ahead or not any(m is message for m in pending):
                return False
            self.acked_ahead.add(offset)
            return True
        pending.popleft()
        self.acknowledged = message.offset + 1
        while pending and pending[0].offset in self.acked_ahead:
            head = pending.popleft().offset
            self.acked_ahead.discard(head)
            self.acknowledged = head + 1
        return True

    def to_commit(self) -> int | None:
        """The offset a commit would store now, or None when that would not move it forward."""
        acknowledged = self.acknowledged
        if acknowledged is None or (self.committed is not None and acknowledged <= self.committed):
            return None
        return acknowledged

    @property
    def held(self) -> bool:
        """A delivered record is unacknowledged while later ones are: it was handed to no stage (a
        delivery cut short), and commits cannot pass it until it is read again."""
        return bool(self.acked_ahead)

    @property
    def first_unacknowledged(self) -> int | None:
        return self.pending[0].offset if self.pending else None

    def seek(self, offset: int) -> None:
        """The partition is read again from `offset`: records from there on are delivered again,
        and their earlier deliveries no longer count."""
        pending = self.pending
        while pending and pending[-1].offset >= offset:
            pending.pop()
        self.acked_ahead = {o for o in self.acked_ahead if o < offset}
        self.next_offset = offset
        self.read = offset - 1 if offset > 0 else None

    @property
    def unacknowledged(self) -> list[Message]:
        return list(self.pending)


__all__ = ["PartitionProgress"]
