"""What a stage's batch step leaves to do for each record it was given."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

# One record's remaining work, run in its conversation's order (None in its place: settled).
Work = Callable[[], Awaitable[None]]


@dataclass(frozen=True, eq=False)
class SharedWork:
    """One work that settles several records of a batch together, in no conversation's order: a
    batch's Redis admission already on its way. The records are acknowledged once it is done; the
    stage goes on with its next batch meanwhile. A step returns the same instance for each of them."""

    run: Work


# Per record: its work, the shared work that settles it, or None (settled already).
Remaining = Work | SharedWork | None


async def run_remaining(remaining: Remaining) -> None:
    """Run what a step left for one record, shared or its own; None is settled already."""
    if isinstance(remaining, SharedWork):
        await remaining.run()
    elif remaining is not None:
        await remaining()
