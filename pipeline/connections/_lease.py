"""A lease this worker holds on a bot's connection channels, kept alive while it holds it.

Renewed every third of its length with a compare-and-extend script. The holder counts its lease
valid until `lease` seconds after the last successful renewal was *sent* (Redis's expiry runs from
when it executed it, a little later), so the holder always gives up first: when a renewal says the
lease is someone else's, or when no renewal succeeded in time (Redis unreachable), `lost` is set
and the connection must stop at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from pipeline.state import ConnectionStore, LeaseState
from pipeline.state.exceptions import UNAVAILABLE

log = logging.getLogger(__name__)

# The part of the lease the holder does not count on: clock rates differ a little between hosts.
_SAFETY = 0.05
_RENEWAL_FAILED: tuple[type[BaseException], ...] = (TimeoutError, *UNAVAILABLE)


class HeldLease:
    def __init__(
        self,
        store: ConnectionStore,
        platform: str,
        bot_id: str,
        channels: Sequence[str],
        *,
        holder: str,
        token: int,
        seconds: float,
        state: LeaseState,
        acquired_at: float,
    ) -> None:
        self.store = store
        self.platform = platform
        self.bot_id = bot_id
        self.channels = tuple(sorted(channels))
        self.holder = holder
        self.token = token
        self.seconds = seconds
        self.state: LeaseState = state
        self.lost = asyncio.Event()
        self.why_lost = ""
        self._valid_until = acquired_at + seconds * (1 - _SAFETY)
        self._task: asyncio.Task[None] | None = None

    @property
    def owner(self) -> str:
        return f"{self.holder}|{self.token}"

    @property
    def ttl_ms(self) -> int:
        return int(self.seconds * 1000)

    def start(self) -> None:
        self._task = asyncio.create_task(self._keep(), name=f"lease {self.platform}/{self.bot_id}")

    def lose(self, why: str) -> None:
        if not self.lost.is_set():
            self.why_lost = why
            self.lost.set()

    async def set_state(self, state: LeaseState) -> None:
        """Say what the holder is doing now (`dialing`, `up`), at once."""
        self.state = state
        await self._renew()

    async def _renew(self) -> None:
        sent = time.monotonic()
        remaining = self._valid_until - sent
        if remaining <= 0:
            self.lose("expired")
            return
        try:
            async with asyncio.timeout(remaining):
                ok = await self.store.renew(
                    self.platform, self.bot_id, self.channels, self.owner, self.ttl_ms, self.state
                )
        except _RENEWAL_FAILED:
            if time.monotonic() >= self._valid_until:
                self.lose("expired")
            return
        if not ok:
            self.lose("taken")
            return
        self._valid_until = sent + self.seconds * (1 - _SAFETY)

    async def _keep(self) -> None:
        period = self.seconds / 3
        while not self.lost.is_set():
            # After a failed renewal, try again sooner; never sleep past the validity.
            wait = min(period, max(0.0, self._valid_until - time.monotonic() - period))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(wait, 0.05)):
                    await self.lost.wait()
            if self.lost.is_set():
                return
            try:
                await self._renew()
            except Exception:  # a bug must not leave a connection held without a lease
                log.exception("lease renewal of %s/%s failed", self.platform, self.bot_id)
                self.lose("error")

    async def release(self) -> None:
        """Stop renewing and give the leases up (never a newer holder's)."""
        self.lose(self.why_lost or "released")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):  # unreachable Redis: the lease expires on its own
            async with asyncio.timeout(2.0):
                await self.store.release(self.platform, self.bot_id, self.channels, self.owner)
