"""A stand-in served from a thread of its own with its own event loop: the stack's workers are
other processes and each test runs on its own loop, so the stand-in outlives them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class LoopThread(Generic[T]):
    """Runs `make()` (which builds the stand-in) on the thread's loop at `start`, and `close(it)` at
    `stop`."""

    def __init__(
        self, name: str, make: Callable[[], Awaitable[T]], close: Callable[[T], Coroutine[Any, Any, None]]
    ) -> None:
        self._make, self._close = make, close
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self.standin: T | None = None

    def start_loop(self) -> T:
        self._thread.start()

        async def make() -> T:
            return await self._make()

        self.standin = self._run(make())
        return self.standin

    def stop_loop(self) -> None:
        try:
            if self.standin is not None:
                self._run(self._close(self.standin))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))
