"""Overload: a message whose turn has not started within a bound gets the notice `overloaded`
instead of an answer to a question asked long ago.

How long a message has waited is read from its own hop times (`hops`: ms since the epoch, stamped
by each stage): from when ingress received it (`ingress`, else when ingest took it) to now. Turns
wait when the agent API is slow or answers 429 (the session client retries with back-off), when the
session is busy (held messages), or when dispatch is behind.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field


class OverloadConfig(BaseModel):
    """`[bots.overload]`."""

    model_config = ConfigDict(extra="forbid")

    # A message not started within this many seconds of its receipt gets `overloaded` instead. 0: no bound.
    max_wait_seconds: float = Field(default=180.0, ge=0, le=86400)


def waited_seconds(hops: Mapping[str, float], now_ms: float) -> float | None:
    """Seconds since the message was received (None: no receipt time recorded)."""
    start = hops.get("ingress", hops.get("ingest"))
    return None if start is None else max(0.0, (now_ms - start) / 1000.0)


def too_late(config: OverloadConfig, hops: Mapping[str, float], now_ms: float) -> bool:
    waited = waited_seconds(hops, now_ms)
    return config.max_wait_seconds > 0 and waited is not None and waited > config.max_wait_seconds
