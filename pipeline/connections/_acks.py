"""Acknowledgements a transport sends on the wire once a frame's messages are on the broker (Slack
envelope acknowledgements, Lark response frames): one task each, so reading goes on meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

# On close, acknowledgements waiting for the broker get this long before the socket closes.
GRACE_SECONDS = 5.0


class Acknowledgements:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def after(self, acknowledge: Coroutine[Any, Any, None]) -> None:
        """Run `acknowledge` (which awaits the broker, then writes) on the side."""
        task = asyncio.create_task(acknowledge)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self, timeout: float = GRACE_SECONDS) -> None:
        """Let the acknowledgements in flight go out (the socket is about to close)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
