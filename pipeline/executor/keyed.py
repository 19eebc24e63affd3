"""Keyed executor.

A stage's fetched records arrive a batch at a time on one loop, and one slow HTTP call must not
stall the batches after it. Stages hand each record's remaining work to this executor: work for
one key (conversation) runs strictly in order, work for different keys runs concurrently up to
`max_in_flight`, and each record's ack callback runs only once it and every earlier record of its
partition are finished. A crash therefore replays from the first unfinished record; idempotency
makes the replay harmless.

A work may `defer` its last wait (the broker's acknowledgement of what it produced): the key's next
work starts at once, and the record counts as finished only once the deferred wait is done. A key
is then as fast as its own steps, not one broker round trip per record; a chat flooding a key no
longer falls behind itself and holds back its partition's acks (and, through `max_pending`, every
partition's fetch).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[Any]]
Ack = Callable[[], object]  # synchronous: run as the ticket is released


@dataclass(eq=False, slots=True)
class Ticket:
    key: Hashable
    partition: Hashable
    offset: int
    work: Work
    ack: Ack | None
    done: bool = False
    error: BaseException | None = None
    # Its partition was revoked: the partition's new owner replays the message.
    revoked: bool = False
    # What its work left to wait for outside the key's order (`defer`); done once they are.
    tails: list[Work] | None = None
    # Its work is running: only then may it defer (a task the work started outlives it).
    deferrable: bool = False


# The ticket whose work the current task runs (each key's runner is a task of its own).
_running: ContextVar[Ticket | None] = ContextVar("switchboard_executor_ticket", default=None)


def work_revoked() -> bool:
    """Whether the work running in this task belongs to a partition revoked meanwhile. Its ack
    no longer runs and the new owner replays the message: the work should add nothing the chat
    would see on top of that replay (a failure notice, say)."""
    ticket = _running.get()
    return ticket is not None and ticket.revoked


def defer(tail: Work) -> bool:
    """From a key's work: run `tail` after the work returns, outside the key's order, so that the
    key's next work starts at once. The record is finished (and acknowledged, in offset order) only
    once `tail` is done. Returns False outside a key's work: the caller then awaits `tail` itself."""
    ticket = _running.get()
    if ticket is None or not ticket.deferrable:
        return False
    if ticket.tails is None:
        ticket.tails = []
    ticket.tails.append(tail)
    return True


def wrap_deferred(wrap: Callable[[Work], Work]) -> None:
    """Wrap what the running work deferred (a stage's failure handling for the tail)."""
    ticket = _running.get()
    if ticket is not None and ticket.tails:
        ticket.tails = [wrap(tail) for tail in ticket.tails]


async def _nothing() -> None:
    return None


class KeyedExecutor:
    """Run `work` per key in FIFO order; release acks per partition in offset order."""

    def __init__(
        self,
        max_in_flight: int = 256,
        *,
        max_pending: int | None = None,
        on_error: Callable[[Ticket, BaseException], Any] | None = None,
        name: str = "executor",
        max_groups: int = 4,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.name = name
        self.max_in_flight = max_in_flight
        # Bound on accepted-but-unacked tickets: `submit` waits beyond it, which stops the stage's
        # consumer loop and so applies back-pressure to the broker fetch.
        self.max_pending = max_pending or max_in_flight * 8
        self._on_error = on_error
        self._slots = asyncio.Semaphore(max_in_flight)
        self._queues: dict[Hashable, deque[Ticket]] = {}
        self._runners: dict[Hashable, asyncio.Task[None]] = {}
        self._by_partition: dict[Hashable, deque[Ticket]] = {}
        self._pending = 0
        self._space = asyncio.Condition()
        self._blocked = 0  # submitters waiting for room
        self._in_flight = 0
        self._closed = False
        # Works that settle a group of held tickets (`settle_group`), and how many may run at once.
        self._groups: set[asyncio.Task[None]] = set()
        self.max_groups = max_groups
        # Deferred tails running (`defer`), each finishing its ticket.
        self._tails: set[asyncio.Task[None]] = set()

    # -- introspection (metrics) ------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def active_keys(self) -> int:
        return len(self._runners)

    @property
    def deferred(self) -> int:
        """Tickets whose work returned and whose deferred tail is still running."""
        return len(self._tails)

    # -- submission -------------------------------------------------------------------------
    async def submit(
        self, key: Hashable, work: Work, *, partition: Hashable = 0, offset: int = -1, ack: Ack | None = None
    ) -> Ticket:
        """Queue `work` behind earlier work for `key`. Waits while too much is pending."""
        if self._closed:
            raise RuntimeError(f"{self.name} is closed")
        if self._pending >= self.max_pending:
            self._blocked += 1
            try:
                async with self._space:
                    await self._space.wait_for(lambda: self._pending < self.max_pending or self._closed)
            finally:
                self._blocked -= 1
        ticket = Ticket(key=key, partition=partition, offset=offset, work=work, ack=ack)
        self._pending += 1
        self._by_partition.setdefault(partition, deque()).append(ticket)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(ticket)
        if key not in self._runners:
            self._runners[key] = asyncio.create_task(self._drain(key), name=f"{self.name}:{key}")
        return ticket

    def submit_done(self, *, partition: Hashable = 0, offset: int = -1, ack: Ack | None = None) -> None:
        """Record a message handled inline (no work): its ack still waits for earlier offsets.
        Not a coroutine: most records of a batch take this path, and it never waits."""
        tickets = self._by_partition.get(partition)
        if not tickets:
            if ack is not None:
                ack()
            return
        ticket = Ticket(key=None, partition=partition, offset=offset, work=_nothing, ack=ack, done=True)
        self._pending += 1
        tickets.append(ticket)

    def hold(self, *, partition: Hashable = 0, offset: int = -1, ack: Ack | None = None) -> Ticket:
        """Record a message whose work runs with others' (`settle_group`): its ack, and every later
        one of its partition, waits until that work is done. Not a coroutine, like `submit_done`."""
        ticket = Ticket(key=None, partition=partition, offset=offset, work=_nothing, ack=ack)
        self._pending += 1
        self._by_partition.setdefault(partition, deque()).append(ticket)
        return ticket

    async def settle_group(self, tickets: list[Ticket], work: Work) -> None:
        """Run `work` for the held `tickets` in a task of its own, outside any key's order, then
        release them (a failed work is logged and released, as a key's work is: a stage handles its
        own errors). Waits while `max_groups` such works are running: the stage's consumer then
        stops fetching, as it does when too much is pending."""
        while len(self._groups) >= self.max_groups:
            await asyncio.wait(self._groups, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.create_task(self._settle(tickets, work), name=f"{self.name}:group")
        self._groups.add(task)
        task.add_done_callback(self._groups.discard)

    async def _settle(self, tickets: list[Ticket], work: Work) -> None:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # never stall the partitions behind
            log.exception("%s: unhandled error in a group's work", self.name)
            for ticket in tickets:
                ticket.error = exc
        partitions: dict[Hashable, None] = {}  # in order, once each
        for ticket in tickets:
            ticket.done = True
            partitions[ticket.partition] = None
        for partition in partitions:
            await self._release(partition)

    async def _drain(self, key: Hashable) -> None:
        queue = self._queues[key]
        try:
            while queue:
                ticket = queue[0]
                async with self._slots:
                    self._in_flight += 1
                    _running.set(ticket)
                    ticket.deferrable = True
                    try:
                        await ticket.work()
                    except asyncio.CancelledError:
                        raise
                    except BaseException as exc:  # a stage must handle its own errors; never stall
                        self._failed(ticket, exc)
                    finally:
                        ticket.deferrable = False
                        self._in_flight -= 1
                queue.popleft()
                tails, ticket.tails = ticket.tails, None
                if tails:  # finished by its tails; the key goes on meanwhile
                    task = asyncio.create_task(self._finish(ticket, tails), name=f"{self.name}:{key}:tail")
                    self._tails.add(task)
                    task.add_done_callback(self._tails.discard)
                    continue
                ticket.done = True
                await self._release(ticket.partition)
        finally:
            if not queue:
                self._queues.pop(key, None)
            self._runners.pop(key, None)

    def _failed(self, ticket: Ticket, exc: BaseException) -> None:
        ticket.error = exc
        log.exception("%s: unhandled error for key %s", self.name, ticket.key)
        if self._on_error is not None:
            self._on_error(ticket, exc)

    async def _finish(self, ticket: Ticket, tails: list[Work]) -> None:
        """Run a ticket's deferred tails in order, then release it (a failed tail is logged and
        released, as a failed work is)."""
        for tail in tails:
            try:
                await tail()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                self._failed(ticket, exc)
        ticket.done = True
        await self._release(ticket.partition)

    async def _release(self, partition: Hashable) -> None:
        """Ack the finished prefix of this partition's tickets, in offset order."""
        tickets = self._by_partition.get(partition)
        released = 0
        while tickets and tickets[0].done:
            ticket = tickets.popleft()
            released += 1
            if ticket.ack is not None:
                ticket.ack()
        if released:
            self._pending -= released
            if self._blocked:  # a submitter waits for room (rare: the condition costs a lock per release)
                async with self._space:
                    self._space.notify_all()
        if tickets is not None and not tickets:
            self._by_partition.pop(partition, None)

    # -- lifecycle --------------------------------------------------------------------------
    async def join(self) -> None:
        """Wait until everything submitted so far has finished and been released."""
        while self._runners or self._groups or self._tails:
            await asyncio.gather(
                *list(self._runners.values()), *list(self._groups), *list(self._tails), return_exceptions=True
            )

    def drop_partitions(self, partitions: set[Hashable]) -> int:
        """Forget unreleased tickets of revoked partitions: their acks must not run any more.

        Work already running finishes; queued work for those partitions is skipped. Returns the
        number of tickets dropped (they will be replayed by the partition's new owner).
        """
        dropped = 0
        for partition in partitions:
            tickets = self._by_partition.pop(partition, None)
            if not tickets:
                continue
            for ticket in tickets:
                ticket.ack = None
                ticket.revoked = True
                dropped += 1
            drop = {id(t) for t in tickets}
            for queue in self._queues.values():
                # The head may be running: it finishes, but its ack no longer runs. Queued work
                # of the revoked partitions is skipped (mutated in place: `_drain` holds it).
                for ticket in list(queue)[1:]:
                    if id(ticket) in drop:
                        queue.remove(ticket)
        self._pending -= dropped
        return dropped

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._runners.values(), *self._groups, *self._tails]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        async with self._space:
            self._space.notify_all()
