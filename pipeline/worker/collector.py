"""The cyclic garbage collector, tuned for a worker: young collections rare, full ones on a timer.

Python's defaults (a young collection every 700 allocations, each also scanning the long-lived
objects of Faust, pydantic and the clients) took a quarter of a busy worker's CPU. Nearly all of
the pipeline's garbage is freed by reference counting, so young collections can be rare
(`THRESHOLDS`), and what lives once the worker has started is frozen out of every scan
(`gc.freeze()` in the app's start-up).

Rare young collections leave one kind of garbage waiting: a cycle one of whose objects had already
survived a collection. The session client's HTTP connections are such cycles: a connection lives
across several turns (long enough to be promoted), and when the session server closes it, aiohttp's
protocol, its transport and the `ServerDisconnectedError` it keeps refer to each other. With young
collections a minute apart and older generations collected every twenty or a hundred of them, those
cycles waited up to hours: the worker's RSS grew by some 500 bytes per message. A full collection on
a timer bounds that garbage to what a minute makes, at the price of a pause of a few milliseconds a
minute (`switchboard_gc_full_collection_seconds`), since the frozen objects are not scanned.
"""

from __future__ import annotations

import gc
import time

from pipeline import metrics

THRESHOLDS = (50_000, 20, 100)
#: Seconds between the timed full collections.
FULL_COLLECTION_INTERVAL = 60.0


def tune() -> None:
    gc.set_threshold(*THRESHOLDS)


def collect_cycles() -> float:
    """One full collection, timed; its duration in seconds."""
    started = time.perf_counter()
    gc.collect()
    took = time.perf_counter() - started
    metrics.GC_FULL_COLLECTION.observe(took)
    return took
