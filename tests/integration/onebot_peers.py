"""The OneBot v11 stand-in implementation (`pipeline.bench.onebot_peer`) on a background thread with
its own event loop: the stack's workers are other processes and each test runs on its own loop, so
the stand-in (a server Switchboard dials, or a client dialling the workers) outlives them."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from pipeline.bench.onebot_peer import Action, OneBotPeer, Socket


class PeerThread:
    def __init__(self, **options: Any) -> None:
        self._options = options
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="onebot-peer", daemon=True)
        self.peer: OneBotPeer | None = None

    def start(self) -> PeerThread:
        self._thread.start()

        async def make() -> OneBotPeer:
            return OneBotPeer(**self._options)

        self.peer = self._run(make())
        return self

    def stop(self) -> None:
        try:
            if self.peer is not None:
                self._run(self.peer.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    async def _on_loop(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @property
    def _peer(self) -> OneBotPeer:
        assert self.peer is not None, "start() first"
        return self.peer

    # -- on the peer's loop ---------------------------------------------------------------------
    def serve(self) -> str:
        return str(self._run(self._peer.serve()))

    def dial(self, urls: Callable[[], list[str]]) -> None:
        async def dial() -> None:
            self._peer.dial(urls)

        self._run(dial())

    async def send_event(self, event: dict[str, Any]) -> None:
        await self._on_loop(self._peer.send_event(event))

    # -- reading (snapshots: the peer's loop appends, this thread only copies) ----------------------
    def actions(self) -> list[Action]:
        return list(self._peer.actions)

    def replies(self) -> list[Action]:
        return [a for a in self.actions() if a.action in ("send_private_msg", "send_group_msg") and a.ok]

    def sockets(self) -> list[Socket]:
        return list(self._peer.sockets)

    def open_sockets(self) -> list[Socket]:
        return [s for s in self.sockets() if s.closed is None]

    def delivered(self) -> list[tuple[dict[str, Any], int, float]]:
        return list(self._peer.delivered)

    @property
    def errors(self) -> list[str]:
        return list(self._peer.errors)

    @property
    def refused(self) -> list[str]:
        return list(self._peer.refused)


__all__ = ["PeerThread"]
