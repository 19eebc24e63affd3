"""Retry policy: exponential backoff with full jitter, honouring the server's ``retry-after``."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRYABLE_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504, 529})


@dataclass(slots=True)
class RetryPolicy:
    max_attempts: int = 5  # total tries, including the first
    base_delay: float = 0.2
    max_delay: float = 10.0
    max_retry_after: float = 60.0  # never sleep longer than this on a server hint
    rng: random.Random = field(default_factory=random.Random)

    def backoff(self, attempt: int) -> float:
        """Full jitter (AWS architecture blog): uniform in [0, min(cap, base * 2**attempt)]."""
        ceiling = min(self.max_delay, self.base_delay * (2 ** max(attempt, 0)))
        return self.rng.uniform(0.0, ceiling)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after)
        return self.backoff(attempt)


def parse_retry_after(value: str | None) -> float | None:
    """``retry-after`` is either delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max((when - datetime.now(UTC)).total_seconds(), 0.0)
