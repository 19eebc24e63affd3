"""Holding the event loop in a test, as a long callback or a starved process would."""

from __future__ import annotations

import time


def hold_the_loop(seconds: float) -> None:
    """Block the running event loop for `seconds`. A plain function: ruff's ASYNC251 flags a
    blocking sleep inside a coroutine, and here the block is the point."""
    time.sleep(seconds)
