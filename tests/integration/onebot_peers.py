"""The OneBot v11 stand-in implementation (`pipeline.bench.onebot_peer`) on a background thread with
its own event loop: the stack's workers are other processes and each test runs on its own loop, so
the stand-in (a server Switchboard dials, or a client dialling the workers) outlives them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.bench.onebot_peer import Action, OneBotPeer, Socket

from .loop_thread import LoopThread


class PeerThread(LoopThread[OneBotPeer]):
    def __init__(self, **options: Any) -> None:
        async def make() -> OneBotPeer:
            return OneBotPeer(**options)

        super().__init__("onebot-peer", make, OneBotPeer.stop)

    @property
    def peer(self) -> OneBotPeer | None:
        return self.standin

    def start(self) -> PeerThread:
        self.start_loop()
        return self

    def stop(self) -> None:
        self.stop_loop()

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
