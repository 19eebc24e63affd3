"""Waiting out Redis unavailability: the one retry that stages and the worker share.

Redis restarting, loading its AOF, or failing over is outlived by waiting: the caller holds its
work back (a partition, a rebalance's resume) with capped exponential backoff and tries again.
Every other error propagates to the caller.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pipeline import metrics

from .exceptions import UNAVAILABLE

log = logging.getLogger(__name__)

T = TypeVar("T")


def backoff(attempt: int, *, base: float = 0.1, cap: float = 5.0) -> float:
    """Seconds before retry `attempt` (1, 2, …): base·2^attempt, at most `cap`."""
    return float(min(cap, base * 2**attempt))


async def while_unavailable(
    call: Callable[[], Awaitable[T]],
    *,
    stage: str,
    doing: str = "",
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """`call()` until it does not fail because Redis is unavailable; other errors propagate.

    Each retry is counted in `switchboard_handler_retries_total{stage}` and logged with `doing`.
    """
    attempt = 0
    while True:
        try:
            return await call()
        except UNAVAILABLE as exc:
            attempt += 1
            metrics.HANDLER_RETRIES.labels(stage, type(exc).__name__).inc()
            log.warning("%s: %s%s; retry %d", stage, doing and doing + ": ", type(exc).__name__, attempt)
            await sleep(backoff(attempt))
