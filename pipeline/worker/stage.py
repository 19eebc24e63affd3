"""A stage's runner: what the driver delivers one topic's fetched records to.

Each record's value is parsed once (pydantic, from JSON). The stage's batch step then sees every
parsed record of the batch at once (one Redis round trip for all of them, where the stage can),
and returns per record the work that remains, or None when the record is settled. Remaining work
runs in the stage's keyed executor: in order per conversation, concurrently across them; each
record is acknowledged when it and every earlier record of its partition are done, so a committed
offset never passes unfinished work.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from faust.types import Message
from pydantic import BaseModel, ValidationError

from pipeline import hopstamps, metrics
from pipeline.executor import KeyedExecutor, Ticket
from pipeline.records import Position
from pipeline.stages.outputs import Outputs
from pipeline.stages.work import Remaining, SharedWork, Work, run_remaining

from .handling import Handling

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)

# A stage's batch step, given the records and where each came from: per record, what remains.
BatchStep = Callable[[list[R], list[Position]], Awaitable[Sequence[Remaining]]]


@dataclass(eq=False)
class _Group(Generic[R]):
    """The records a shared work settles, and the tickets that hold them."""

    tickets: list[Ticket] = field(default_factory=list)
    members: list[tuple[R, Message]] = field(default_factory=list)


@dataclass(frozen=True)
class Stage(Generic[R]):
    """One stage on one topic."""

    name: str  # the metric label: ingest, dispatch, render, egress
    topic: str
    record_type: type[R]
    step: BatchStep[R]


class StageRunner(Generic[R]):
    def __init__(
        self,
        stage: Stage[R],
        executor: KeyedExecutor,
        outputs: Outputs,
        ack: Callable[[Message], Any],
        *,
        handling: Handling | None = None,
    ) -> None:
        self.stage = stage
        self.executor = executor
        self.outputs = outputs
        self._ack = ack
        self.handling = handling or Handling(stage.name)

    async def deliver(self, messages: Sequence[Message]) -> None:
        stage = self.stage
        # `switchboard bench`'s finer stamps (pipeline/hopstamps.py): off, one attribute read per batch.
        stamping = hopstamps.enabled
        fetched = hopstamps.now_ms() if stamping else 0.0
        parsed: list[R | None] = []
        records: list[R] = []
        positions: list[Position] = []
        for message in messages:
            try:
                record = stage.record_type.model_validate_json(message.value or b"")
            except ValidationError as exc:
                parsed.append(None)
                await self._dead_letter(message, "invalid_record", str(exc)[:500])
                continue
            if "replay" in getattr(record, "hops", ()):  # put back by `switchboard deadletters replay`
                _replayed(stage.name, message)
            parsed.append(record)
            records.append(record)
            positions.append(Position(message.topic, message.partition, message.offset))
            if stamping:
                self._stamp_fetched(record, message, fetched)
        works: Sequence[Remaining] | None = None
        if records:
            try:
                works = await self.handling.retrying(lambda: stage.step(records, positions))
            except Exception:
                log.exception("%s: batch step failed; handling the records one at a time", stage.name)
            if works is not None and len(works) != len(records):
                log.error("%s: batch step gave %d results for %d records", stage.name, len(works), len(records))
                works = None
        if stamping:
            stepped = hopstamps.now_ms()
            for record in records:
                hops = _hops_of(record)
                if hops is not None:
                    hops[f"{stage.name}.stepped"] = stepped
        planned = iter(works) if works is not None else None
        executor = self.executor
        groups: dict[SharedWork, _Group[R]] = {}
        # Per partition, the records held for one shared work since that partition's last other
        # record: they share one ticket, acknowledged together. A backlog of chatter is one run per
        # partition and batch; a ticket of its own for each record cost measurably more CPU.
        runs: dict[Any, tuple[SharedWork, list[Message]]] = {}
        for message, parsed_record in zip(messages, parsed, strict=True):
            tp = message.tp
            work = None
            if parsed_record is not None:
                work = next(planned) if planned is not None else self._alone(parsed_record, message)
            if isinstance(work, SharedWork):
                assert parsed_record is not None
                group = groups.get(work)
                if group is None:
                    group = groups[work] = _Group()
                group.members.append((parsed_record, message))
                run = runs.get(tp)
                if run is not None and run[0] is work:
                    run[1].append(message)
                    continue
                held = [message]
                runs[tp] = (work, held)
                group.tickets.append(
                    executor.hold(partition=tp, offset=message.offset, ack=functools.partial(self._ack_each, held))
                )
                continue
            runs.pop(tp, None)
            ack = functools.partial(self._ack, message)
            if work is None:
                executor.submit_done(partition=tp, offset=message.offset, ack=ack)
                continue
            assert parsed_record is not None
            dead_letter = functools.partial(self._dead_letter, message)
            handled: Work = functools.partial(self.handling.run, work, dead_letter)
            hops = _hops_of(parsed_record) if stamping else None
            if hops is not None:
                handled = functools.partial(self._stamped, hops, handled)
            await executor.submit(
                getattr(parsed_record, "conversation_key", None) or message.partition,
                handled,
                partition=tp,
                offset=message.offset,
                ack=ack,
            )
        for shared, group in groups.items():
            await executor.settle_group(group.tickets, functools.partial(self._shared, shared, group.members))

    def _stamp_fetched(self, record: R, message: Message, fetched: float) -> None:
        hops = _hops_of(record)
        if hops is None:
            return
        name = self.stage.name
        hops[f"{name}.fetched"] = fetched
        if f"{name}.sent" in hops:  # produced with stamps on (not a record from outside, as the bench's drain)
            hopstamps.ACKS.read(message.topic, message.partition, message.offset, hops, f"{name}.acked")

    async def _stamped(self, hops: dict[str, float], handled: Work) -> None:
        with hopstamps.working(self.stage.name, hops):
            await handled()

    def _ack_each(self, messages: list[Message]) -> None:
        for message in messages:
            self._ack(message)

    async def _shared(self, shared: SharedWork, members: list[tuple[R, Message]]) -> None:
        """The group's work; should it fail, each of its records goes through the step again alone
        (retried while Redis is away, dead-lettered if it breaks the step), in offset order."""
        try:
            await shared.run()
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(
                "%s: a shared work failed (%s); handling its records one at a time", self.stage.name, type(exc).__name__
            )
        for record, message in members:
            await self.handling.run(self._alone(record, message), functools.partial(self._dead_letter, message))

    def _alone(self, record: R, message: Message) -> Work:
        """The batch step for one record, run in its conversation's turn (after a batch failed:
        a record that breaks the step is dead-lettered without taking the others with it)."""
        position = Position(message.topic, message.partition, message.offset)

        async def work() -> None:
            (remaining,) = await self.stage.step([record], [position])
            await run_remaining(remaining)

        return work

    async def _dead_letter(self, message: Message, reason: str, error: str) -> None:
        raw = message.value
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        key = message.key.decode("utf-8", "replace") if isinstance(message.key, bytes) else None
        await self.outputs.dead_letter(
            self.stage.name,
            reason,
            text,
            error=error,
            key=key,
            topic=message.topic,
            partition=message.partition,
            offset=message.offset,
        )


def _hops_of(record: BaseModel) -> dict[str, float] | None:
    """The record's `hops` (every topic's record has them; a test's record type may not)."""
    hops = getattr(record, "hops", None)
    return hops if isinstance(hops, dict) else None


def _replayed(stage: str, message: Message) -> None:
    metrics.REPLAYED_RECORDS.labels(stage).inc()
    log.info("%s: a replayed record, %s[%d]@%d", stage, message.topic, message.partition, message.offset)
