"""Long connections: each bot whose transport is not a webhook has its connection held by exactly
one worker at a time, taken over by another when the holder dies.

- `Connections` (one per worker): competes for the leases of dialed transports and holds what it
  wins, accepts the connections the platform's side dials, serves the actions other workers queue
  for the bots it holds, and exports which bots have no holder.
- `ActionRouter` (`Connections.router`): runs an action over a bot's held connection from any
  worker, through Redis (no worker talks to another).
- `base`: what a transport implements (`Transport`, `Connection`) and gets (`Link`).
- `onebot`: OneBot v11 over forward and reverse WebSocket.
- `telegram`: Telegram Bot API `getUpdates` long polling.
- `dingtalk`: DingTalk Stream mode (a WebSocket opened with a ticket of `connections/open`).
- `discord`: Discord's Gateway (resumed from the session state kept under the lease).
- `slack`: Slack Socket Mode; `lark`: Lark/Feishu's long connection (events in, replies over HTTP).
- `satori`: a Satori server's event WebSocket (resumed from the last durable `sn` kept under the lease).
- `matrix`: Matrix `/sync` (its `next_batch` token kept under the lease, so a new holder resumes).

The mechanism and its bounds: docs/architecture.md, "Long connections".
"""

from __future__ import annotations

from pipeline.settings import Settings
from pipeline.stages.outputs import Outputs
from pipeline.stages.refused_early import EarlyRefusals
from pipeline.state import ConnectionStore, Keys, RedisClient, RedisPy

from ._actions import ActionRouter
from ._inbound import InboundSink, Send
from ._manager import Connections, LongConnectionBot
from .base import ActionAnswer, Connection, Link, Transport
from .dingtalk import TRANSPORTS as _DINGTALK
from .discord import TRANSPORTS as _DISCORD
from .lark import TRANSPORTS as _LARK
from .matrix import TRANSPORTS as _MATRIX
from .onebot import TRANSPORTS as _ONEBOT
from .satori import TRANSPORTS as _SATORI
from .slack import TRANSPORTS as _SLACK
from .telegram import TRANSPORTS as _TELEGRAM


def transports() -> dict[tuple[str, str], Transport]:
    """Every long-connection transport, by (platform, transport name as in the bots file)."""
    return {**_ONEBOT, **_TELEGRAM, **_SLACK, **_LARK, **_DINGTALK, **_DISCORD, **_SATORI, **_MATRIX}


def open_connections(
    settings: Settings,
    redis: RedisClient,
    blocking: RedisPy,
    send: Send,
    outputs: Outputs,
    *,
    holder: str,
    refusals: EarlyRefusals | None = None,
) -> Connections:
    """A worker's `Connections` over the stores' Redis client, a redis-py client of its own for the
    blocking waits, and the producer (`send`: queued, returning the broker's acknowledgement);
    `refusals`: the triggers its ingest found over a limit, dropped as their frames come in."""
    store = ConnectionStore(
        redis, blocking, Keys(settings.redis_prefix, cluster=redis.cluster), done_ttl=settings.dedup_ttl_seconds
    )
    sink = InboundSink(send, outputs, patience=settings.connection_produce_patience_seconds, refusals=refusals)
    return Connections(settings, store, sink, holder=holder, transports=transports())


__all__ = [
    "ActionAnswer",
    "ActionRouter",
    "Connection",
    "Connections",
    "Link",
    "LongConnectionBot",
    "Transport",
    "open_connections",
    "transports",
]
