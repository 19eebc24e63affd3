"""How a stage's work meets failure: one path for every stage.

Shared infrastructure that a retry outlives (Redis restarting, loading its AOF, a full connection
pool): wait with capped exponential backoff and try again, holding the partition back rather than
losing the record; stage work is idempotent, so a repeat is harmless. Anything else is a bug or a
record the stage cannot handle: it goes to the dead-letter topic with the error, and the partition
moves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pipeline import metrics
from pipeline.state.exceptions import UNAVAILABLE

log = logging.getLogger(__name__)

T = TypeVar("T")

# Failures of shared infrastructure that a retry outlives.
TRANSIENT_ERRORS = UNAVAILABLE

# (stage, reason, error text) → a dead letter of the record being handled.
DeadLetter = Callable[[str, str], Awaitable[None]]


def backoff(attempt: int, *, base: float = 0.1, cap: float = 5.0) -> float:
    """Seconds before retry `attempt` (1, 2, …): base·2^attempt, at most `cap`."""
    return float(min(cap, base * 2**attempt))


class Handling:
    """Retries and dead letters for one stage."""

    def __init__(self, stage: str, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.stage = stage
        self._sleep = sleep

    async def retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()` until it does not fail with a transient error; other errors propagate."""
        attempt = 0
        while True:
            try:
                return await call()
            except TRANSIENT_ERRORS as exc:
                attempt += 1
                metrics.HANDLER_RETRIES.labels(self.stage, type(exc).__name__).inc()
                log.warning("%s: %s; retry %d", self.stage, type(exc).__name__, attempt)
                await self._sleep(backoff(attempt))

    async def run(self, work: Callable[[], Awaitable[None]], dead_letter: DeadLetter) -> None:
        """Run one record's work: transient failures retried, anything else dead-lettered."""
        try:
            await self.retrying(work)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s: handling failed; dead-lettering the record", self.stage)
            await dead_letter("handler_error", repr(exc)[:2000])
