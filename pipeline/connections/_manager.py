"""`Connections`: a worker's part in holding the long connections of every bot that has one.

Dialed transports: every worker competes for each such bot's lease (`SET NX` semantics, a fencing
token per new holder) every `SWITCHBOARD_CONNECTION_ACQUIRE_INTERVAL_SECONDS`; the winner dials and
holds the connection while it renews the lease, re-dialling when the connection drops. After three
failed dials in a row it lets the lease go, so a worker with a better path may try.
Accepted transports (the platform's side dials a worker behind a load balancer): the worker that
accepts a connection takes the lease from whoever held it (the newest connection wins); the previous
holder sees at its next renewal that the lease is gone and closes its socket.

A holder stops its connection the moment it cannot renew. Every worker exports, from the leases in
Redis, which bots have no holder with a live connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from pipeline import metrics
from pipeline.platforms import Platform, get_platform
from pipeline.settings import BotConfig, Settings
from pipeline.state import Acquired, ConnectionStore, LeaseState
from pipeline.state.exceptions import UNAVAILABLE

from ._actions import ActionRouter, ActionServer
from ._inbound import InboundSink
from ._lease import HeldLease
from .base import API, EVENT, Connection, DialContext, FrameOutcome, Link, Transport

log = logging.getLogger(__name__)

# Frames whose acknowledgement is awaited at once per connection, before reading waits for them.
_ACKS_IN_FLIGHT = 1000
# Dials in a row that may fail before the holder lets the lease go; the longest wait between dials.
_DIAL_FAILURES_BEFORE_RELEASE = 3
_MAX_BACKOFF = 30.0
_CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True)
class LongConnectionBot:
    bot: BotConfig
    transport: Transport

    @property
    def channels(self) -> tuple[str, ...]:
        return tuple(sorted(self.transport.lease_channels(self.bot)))


class _Link(Link):
    """Frames of one held connection into the sink; the acknowledgements awaited on the side."""

    def __init__(
        self, bot: BotConfig, platform: Platform, sink: InboundSink, store: ConnectionStore, lease: HeldLease
    ) -> None:
        self.bot = bot
        self.platform = platform
        self.sink = sink
        self.store = store
        self.lease = lease
        self.pending: set[asyncio.Future[FrameOutcome]] = set()

    async def submit(self, body: bytes) -> Awaitable[FrameOutcome]:
        while len(self.pending) >= _ACKS_IN_FLIGHT:  # the broker is slow: reading waits for it
            await asyncio.wait(self.pending, return_when=asyncio.FIRST_COMPLETED)
        acked = asyncio.ensure_future(await self.sink.submit(self.bot, self.platform, body))
        self.pending.add(acked)
        acked.add_done_callback(self._settled)
        return acked

    def _settled(self, future: asyncio.Future[FrameOutcome]) -> None:
        self.pending.discard(future)
        if not future.cancelled():
            future.exception()  # counted and logged by the sink

    def alive(self) -> None:
        metrics.CONNECTION_FRAMES.labels(self.bot.platform, "heartbeat").inc()

    async def committed_offset(self) -> int | None:
        return await self.store.committed_offset(self.bot.platform, self.bot.bot_id)

    async def commit_offset(self, offset: int) -> bool:
        committed = await self.store.commit_offset(
            self.bot.platform, self.bot.bot_id, self._channel, self.lease.owner, offset
        )
        return self._still_ours(committed)

    async def resume_state(self) -> str | None:
        return await self.store.resume_state(self.bot.platform, self.bot.bot_id)

    async def commit_resume_state(self, state: str) -> bool:
        committed = await self.store.commit_resume_state(
            self.bot.platform, self.bot.bot_id, self._channel, self.lease.owner, state
        )
        return self._still_ours(committed)

    @property
    def _channel(self) -> str:
        return EVENT if EVENT in self.lease.channels else self.lease.channels[0]

    def _still_ours(self, committed: bool) -> bool:
        if not committed:
            self.lease.lose("taken")
        return committed

    async def still_held(self) -> bool:
        await self.lease.set_state(self.lease.state)  # a renewal: it finds out whether the lease is ours
        return not self.lease.lost.is_set()

    async def drain(self, timeout: float = 10.0) -> None:
        """Wait until the frames read so far are acknowledged (or failed)."""
        if self.pending:
            await asyncio.wait(set(self.pending), timeout=timeout)


class Connections:
    def __init__(
        self,
        settings: Settings,
        store: ConnectionStore,
        sink: InboundSink,
        *,
        holder: str,
        transports: dict[tuple[str, str], Transport],
        platform_for: Callable[[str], Platform] = get_platform,
    ) -> None:
        self.settings = settings
        self.store = store
        self.sink = sink
        self.holder = holder
        self.platform_for = platform_for
        self.bots = [
            LongConnectionBot(bot, transports[(bot.platform, bot.transport)])
            for bot in settings.bots
            if bot.transport != "webhook" and bot.transport not in platform_for(bot.platform).pushed_transports
        ]
        self._by_key = {(entry.bot.platform, entry.bot.bot_id): entry for entry in self.bots}
        self.router = ActionRouter(store, settings.connection_action_timeout_seconds)
        # A holder waits for a response as long as egress keeps asking again (each ask joins it).
        self.hold_timeout = settings.connection_action_timeout_seconds * max(2, settings.egress_max_attempts)
        self.lease_seconds = settings.connection_lease_seconds
        self.acquire_interval = settings.connection_acquire_interval_seconds
        self._stopping = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepted: set[Connection] = set()
        self._accepted_before: set[tuple[str, str, str]] = set()
        self._http: aiohttp.ClientSession | None = None

    # -- lifecycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.bots:
            return
        self._http = aiohttp.ClientSession()
        for entry in self.bots:
            if entry.transport.dialed:
                self._spawn(self._compete(entry), f"dial {entry.bot.platform}/{entry.bot.bot_id}")
        self._spawn(self._export_holders(), "connection holders")

    async def stop(self) -> None:
        """Close every held connection and give its lease up, so another worker takes over at once."""
        self._stopping.set()
        await self.close_accepted()
        if self._tasks:  # they see `_stopping`, close, let the frames read be acknowledged, release
            _, late = await asyncio.wait(set(self._tasks), timeout=15.0)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._http is not None:
            await self._http.close()

    async def close_accepted(self) -> None:
        """Close the accepted connections (the web server is shutting down)."""
        self._stopping.set()
        for connection in list(self._accepted):
            with contextlib.suppress(Exception):
                await connection.close()

    def _spawn(self, coroutine: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coroutine)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def bot(self, platform: str, bot_id: str) -> LongConnectionBot | None:
        return self._by_key.get((platform, bot_id))

    # -- accepted connections (the platform's side dialled this worker) ---------------------------
    async def accept(self, bot: BotConfig, connection: Connection) -> None:
        """Hold an accepted connection until it closes or a newer one elsewhere takes the lease."""
        if self._stopping.is_set():
            await connection.close()
            return
        channels = tuple(sorted(connection.channels))
        acquired_at = time.monotonic()
        try:
            acquired = await self.store.acquire(
                bot.platform, bot.bot_id, channels, self.holder, self._ttl_ms, "up", take=True
            )
        except UNAVAILABLE:  # no lease, no holding: the implementation dials again
            log.warning("%s/%s: Redis unavailable; accepted connection closed", bot.platform, bot.bot_id)
            await connection.close()
            return
        assert acquired is not None  # a take always succeeds
        self._count_change(bot, acquired)
        key = (bot.platform, bot.bot_id, ",".join(channels))
        if key in self._accepted_before:
            metrics.CONNECTION_RECONNECTS.labels(bot.platform, connection.transport).inc()
        self._accepted_before.add(key)
        lease = self._lease(bot, channels, acquired, "up", acquired_at)
        self._accepted.add(connection)
        try:
            why = await self._hold(bot, connection, lease)
            log.info("%s/%s: accepted %s connection ended (%s)", bot.platform, bot.bot_id, connection.transport, why)
        finally:
            self._accepted.discard(connection)
            await lease.release()

    # -- dialed connections (workers compete; the winner dials) ----------------------------------
    async def _compete(self, entry: LongConnectionBot) -> None:
        bot, channels = entry.bot, entry.channels
        rounds_failed = 0
        while not self._stopping.is_set():
            acquired_at = time.monotonic()
            try:
                acquired = await self.store.acquire(
                    bot.platform, bot.bot_id, channels, self.holder, self._ttl_ms, "dialing", take=False
                )
            except UNAVAILABLE:
                acquired = None
            if acquired is None:
                await self._pause(self.acquire_interval)
                continue
            self._count_change(bot, acquired)
            lease = self._lease(bot, channels, acquired, "dialing", acquired_at)
            try:
                dialed = await self._dial_while_held(entry, lease)
            finally:
                await lease.release()
            rounds_failed = 0 if dialed else rounds_failed + 1
            if rounds_failed:  # let the others try first
                await self._pause(min(_MAX_BACKOFF, self.acquire_interval * 2**rounds_failed))

    async def _dial_while_held(self, entry: LongConnectionBot, lease: HeldLease) -> bool:
        """Dial and hold until the lease is lost or dials keep failing; False when no dial succeeded."""
        bot, transport = entry.bot, entry.transport
        assert self._http is not None
        context = DialContext(self.settings, self._http)
        failures, dialed_once, attempt = 0, False, 0
        while not (lease.lost.is_set() or self._stopping.is_set()):
            if attempt:
                metrics.CONNECTION_RECONNECTS.labels(bot.platform, transport.name).inc()
            attempt += 1
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    connection = await transport.connect(bot, context)
            except Exception as exc:
                failures += 1
                metrics.CONNECTION_HANDSHAKES.labels(bot.platform, "dial_failed").inc()
                log.warning(
                    "%s/%s: %s dial failed (%d in a row): %s",
                    bot.platform,
                    bot.bot_id,
                    transport.name,
                    failures,
                    type(exc).__name__,
                )
                if failures >= _DIAL_FAILURES_BEFORE_RELEASE:
                    return dialed_once
                await self._pause(min(_MAX_BACKOFF, 0.5 * 2**failures), lease)
                continue
            failures, dialed_once = 0, True
            metrics.CONNECTION_HANDSHAKES.labels(bot.platform, "dialed").inc()
            log.info("%s/%s: %s connected (token %d)", bot.platform, bot.bot_id, transport.name, lease.token)
            await lease.set_state("up")
            why = await self._hold(bot, connection, lease)
            log.info("%s/%s: %s connection ended (%s)", bot.platform, bot.bot_id, transport.name, why)
            if lease.lost.is_set() or self._stopping.is_set():
                break
            await lease.set_state("dialing")
            await self._pause(random.uniform(0.1, 0.5), lease)  # the peer closed it: dial again soon
        return dialed_once

    # -- holding ----------------------------------------------------------------------------------
    async def _hold(self, bot: BotConfig, connection: Connection, lease: HeldLease) -> str:
        """Run a connection until it ends or the lease is lost; then close it, let the frames read
        be acknowledged and the actions in flight answered. Returns why it ended."""
        platform = self.platform_for(bot.platform)
        link = _Link(bot, platform, self.sink, self.store, lease)
        ended = asyncio.Event()
        metrics.CONNECTIONS_HELD.labels(bot.platform, connection.transport).inc()
        reader = asyncio.create_task(connection.run(link))
        lost = asyncio.create_task(lease.lost.wait())
        stopping = asyncio.create_task(self._stopping.wait())
        server = None
        if API in connection.channels:
            server = asyncio.create_task(
                ActionServer(self.store, bot, connection, lease, ended, hold_timeout=self.hold_timeout).serve()
            )
        why = "closed"
        try:
            await asyncio.wait({reader, lost, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if lease.lost.is_set():
                why = f"lease {lease.why_lost}"
            elif stopping.done():
                why = "worker stopping"
            elif reader.exception() is not None:
                why = f"failed: {type(reader.exception()).__name__}"
        finally:
            ended.set()
            metrics.CONNECTIONS_HELD.labels(bot.platform, connection.transport).dec()
            with contextlib.suppress(Exception):
                await connection.close()
            for task in (lost, stopping):
                task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(5.0):
                    await reader
            await link.drain()
            if server is not None:
                with contextlib.suppress(Exception):
                    await server
        return why

    def _lease(
        self, bot: BotConfig, channels: tuple[str, ...], acquired: Acquired, state: LeaseState, acquired_at: float
    ) -> HeldLease:
        lease = HeldLease(
            self.store,
            bot.platform,
            bot.bot_id,
            channels,
            holder=self.holder,
            token=acquired.token,
            seconds=self.lease_seconds,
            state=state,
            acquired_at=acquired_at,
        )
        lease.start()
        return lease

    def _count_change(self, bot: BotConfig, acquired: Acquired) -> None:
        if acquired.previous is None or acquired.previous.holder != self.holder:
            metrics.CONNECTION_HOLDER_CHANGES.labels(bot.platform, bot.bot_id).inc()
        log.info("%s/%s: holding its connection now (fencing token %d)", bot.platform, bot.bot_id, acquired.token)

    @property
    def _ttl_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    async def _pause(self, seconds: float, lease: HeldLease | None = None) -> None:
        """Sleep, cut short when the worker stops (or the lease is lost)."""
        waits = [asyncio.ensure_future(self._stopping.wait())]
        if lease is not None:
            waits.append(asyncio.ensure_future(lease.lost.wait()))
        try:
            await asyncio.wait(waits, timeout=seconds)
        finally:
            for wait in waits:
                wait.cancel()

    # -- every worker: which bots have nobody holding a live connection --------------------------
    async def _export_holders(self) -> None:
        leases = [(e.bot.platform, e.bot.bot_id, c) for e in self.bots for c in e.channels]
        while not self._stopping.is_set():
            try:
                values = await self.store.holders(leases)
            except UNAVAILABLE:
                values = None
            if values is not None:
                index = 0
                for entry in self.bots:
                    mine = values[index : index + len(entry.channels)]
                    index += len(entry.channels)
                    missing = any(v is None or v.state != "up" for v in mine)
                    metrics.CONNECTION_HOLDER_MISSING.labels(entry.bot.platform, entry.bot.bot_id).set(int(missing))
            await self._pause(max(1.0, self.acquire_interval))
