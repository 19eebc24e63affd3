"""What a long-connection transport implements, and what the framework gives it.

A `Transport` is one way a platform's bot stays connected to Switchboard instead of webhooks (OneBot
`ws-forward` and `ws-reverse`, Telegram `polling`, Slack `socket_mode`, Lark `long_connection`).
Either Switchboard dials it (`dialed = True`: the workers compete for the bot's lease and the winner
calls `connect`), or the platform's side dials a worker, which hands the accepted `Connection` to
`Connections.accept` (the newest connection wins the lease).

A `Connection` carries channels: `event` (frames in, each handed to `Link.submit`, which produces
the bot's messages to `im.inbound` and resolves once the broker has them: a transport that
acknowledges or advances on the wire does so only then) and `api` (actions out: `call`, which any
worker reaches through the holder's action queue).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import aiohttp

from pipeline.settings import BotConfig, Settings

EVENT, API = "event", "api"


@dataclass(frozen=True)
class ActionAnswer:
    """The outcome of one action run over a connection: the platform's response, or an error (a
    short label: `not_connected`, `outcome_unknown`, `no_holder`, `timeout`, `no_api`, …).
    `final`: a repeat of the same request must get this answer instead of running again (the
    platform answered for good, or the action was written and may have been carried out)."""

    response: Mapping[str, Any] | None = None
    error: str = ""
    detail: str = ""
    final: bool = False


@dataclass(frozen=True)
class FrameOutcome:
    """What became of one inbound frame: messages produced (and acknowledged by the broker), or why
    none were (a bounded label)."""

    produced: int = 0
    ignored: str = ""


class Link(abc.ABC):
    """The framework's side of a held connection."""

    bot: BotConfig

    @abc.abstractmethod
    async def submit(self, body: bytes) -> Awaitable[FrameOutcome]:
        """Parse one event frame with the platform's parser and produce its messages, in order with
        the frames submitted before it. Returns at once with an awaitable that resolves when the
        broker has acknowledged them (raising if it could not): acknowledge or advance on the wire
        only after it resolved."""

    @abc.abstractmethod
    def alive(self) -> None:
        """The connection showed it is alive (a heartbeat frame): nothing is produced."""

    # Polled transports (Telegram `getUpdates`): where the next poll starts, kept in Redis under the
    # bot's lease so a new holder resumes there. Only a dialed connection's link has them.
    async def committed_offset(self) -> int | None:
        """The offset the last holder committed (None: none yet)."""
        raise NotImplementedError

    async def commit_offset(self, offset: int) -> bool:
        """Record the offset (after the updates before it were acknowledged by the broker); False
        when the lease is not this holder's any more (nothing written: stop polling)."""
        raise NotImplementedError

    # Resumable sessions (Discord's Gateway): what a new connection needs to resume where the last
    # left off, kept in Redis under the bot's lease so a new holder can resume too.
    async def resume_state(self) -> str | None:
        """The session state the last holder committed (None: none)."""
        raise NotImplementedError

    async def commit_resume_state(self, state: str) -> bool:
        """Record the session state (after the events it counts were acknowledged by the broker);
        False when the lease is not this holder's any more (nothing written: stop)."""
        raise NotImplementedError

    async def still_held(self) -> bool:
        """Check with Redis that the lease is still this holder's (renewing it)."""
        raise NotImplementedError


class Connection(abc.ABC):
    """One live long connection of a bot."""

    transport: str
    channels: frozenset[str]

    @abc.abstractmethod
    async def run(self, link: Link) -> None:
        """Read frames until the connection closes (return) or fails (raise)."""

    async def call(self, action: str, params: Mapping[str, Any], timeout: float) -> ActionAnswer:
        """Run one action over the connection (only for connections with the `api` channel)."""
        return ActionAnswer(error="no_api", detail=f"{self.transport} carries no actions")

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; `run` returns soon after."""


@dataclass(frozen=True)
class DialContext:
    settings: Settings
    http: aiohttp.ClientSession


class Transport(abc.ABC):
    platform: ClassVar[str]
    name: ClassVar[str]  # as written in the bots file (`transport = "…"`)
    dialed: ClassVar[bool]  # Switchboard connects (True), or the platform's side connects to a worker
    # The channels one connection of this transport carries (a dialed one: always these).
    channels: ClassVar[frozenset[str]] = frozenset({EVENT, API})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        """Dial the platform (dialed transports): a live connection, or raise."""
        raise NotImplementedError(f"{self.platform} {self.name} is not dialed by Switchboard")

    def lease_channels(self, bot: BotConfig) -> frozenset[str]:
        """The channels a bot of this transport must have held (what "no holder" is computed from)."""
        return self.channels


__all__ = ["API", "EVENT", "ActionAnswer", "Connection", "DialContext", "FrameOutcome", "Link", "Transport"]
