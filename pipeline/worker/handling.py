"""How a stage's work meets failure: one path for every stage.

Shared infrastructure that a retry outlives (Redis restarting, loading its AOF, a full connection
pool): wait with capped exponential backoff and try again, holding the partition back rather than
losing the record; stage work is idempotent, so a repeat is harmless. Anything else is a bug or a
record the stage cannot handle: it goes to the dead-letter topic with the error, and the partition
moves on.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pipeline.executor import wrap_deferred
from pipeline.state.retry import backoff, while_unavailable

__all__ = ["DeadLetter", "Handling", "backoff"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# (stage, reason, error text) → a dead letter of the record being handled.
DeadLetter = Callable[[str, str], Awaitable[None]]


class Handling:
    """Retries and dead letters for one stage."""

    def __init__(self, stage: str, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.stage = stage
        self._sleep = sleep

    async def retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it does not fail with a transient error; other errors propagate."""
        return await while_unavailable(call, stage=self.stage, sleep=self._sleep)

    async def run(self, work: Callable[[], Awaitable[None]], dead_letter: DeadLetter) -> None:
        """Run one record's work: transient failures retried, anything else dead-lettered."""
        try:
            await self.retrying(work)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: handling failed; dead-lettering the record", self.stage)
            await dead_letter("handler_error", repr(exc)[:2000])
            return
        # What the work left for after its key's order (the broker's acknowledgement of what it
        # produced: `pipeline.executor.defer`) fails the same way: the record is dead-lettered.
        wrap_deferred(lambda tail: functools.partial(self._tail, tail, dead_letter))

    async def _tail(self, tail: Callable[[], Awaitable[None]], dead_letter: DeadLetter) -> None:
        try:
            await tail()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: a deferred wait failed; dead-lettering the record", self.stage)
            await dead_letter("handler_error", repr(exc)[:2000])
