"""Shared state in Redis, one store per concern, all keys under one prefix (`keys.Keys`):

- `conversations`: conversation ↔ session, turn state, the turns sent to a session, held
  messages, the group-context window;
- `markers`: de-duplication markers and ingest's batch admission;
- `streams`: the streams in flight per partition;
- `deliveries`: delivered outbound messages and the shared rate windows;
- `console`: the console's chats;
- `deadlines`: the turns whose platform closes replies to their message after a while;
- `connections` (`ConnectionStore`, opened by `pipeline.connections` with a blocking client of its
  own): the leases of long connections and the actions queued for their holders.

The hot steps are one Lua script each (`scripts/*.lua`). The Redis side, one module per job:

- `redis_url`: `SWITCHBOARD_REDIS_URL` parsed: one server, a Sentinel-managed primary, or a cluster;
- `client`: the stores' client (`RedisClient`: one pipelined connection, no blocking commands);
- `redis_py`: redis-py clients of the same URL (`redis_py_client`), for blocking waits and pub/sub;
- `sentinel`: the watcher both follow a Sentinel-managed primary through failovers with.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.state.client import RedisClient
from pipeline.state.connections import Acquired, ActionClaim, ConnectionStore, LeaseState, LeaseValue
from pipeline.state.console import ConsoleStore, LiveMessage, message_seq, note_message
from pipeline.state.conversations import ConversationStore, TurnMode
from pipeline.state.deadlines import DeadlineStore
from pipeline.state.deliveries import Claim, DeliveryStore, RateWindow
from pipeline.state.exceptions import StateError
from pipeline.state.keys import Keys
from pipeline.state.markers import MarkerStore
from pipeline.state.models import (
    AdmissionResult,
    ContextEntry,
    ContextQuota,
    ConversationState,
    InboundAdmission,
    InflightStream,
    PendingAction,
    TurnEnd,
    TurnRecord,
    TurnStart,
    context_entry_json,
)
from pipeline.state.redis_py import RedisPy, close_redis_py, listen, pubsub, redis_py_client, redis_py_pool
from pipeline.state.redis_url import parse_redis_url
from pipeline.state.streams import StreamStore


@dataclass(frozen=True)
class State:
    """Every store, over one Redis client and key prefix."""

    keys: Keys
    redis: RedisClient
    conversations: ConversationStore
    markers: MarkerStore
    streams: StreamStore
    deliveries: DeliveryStore
    console: ConsoleStore
    deadlines: DeadlineStore

    @classmethod
    def connect(
        cls,
        url: str,
        prefix: str = "sb:",
        *,
        mapping_ttl: int = 7 * 86400,
        dedup_ttl: int = 86400,
        replica_wait_ms: int = 0,
    ) -> State:
        """The stores over a new client of the Redis at `url` (it connects on first use)."""
        redis = RedisClient(url, replica_wait_ms=replica_wait_ms)
        return cls.open(redis, prefix, mapping_ttl=mapping_ttl, dedup_ttl=dedup_ttl)

    @classmethod
    def open(
        cls, redis: RedisClient, prefix: str = "sb:", *, mapping_ttl: int = 7 * 86400, dedup_ttl: int = 86400
    ) -> State:
        keys = Keys(prefix, cluster=redis.cluster)
        ttls = {"mapping_ttl": mapping_ttl, "dedup_ttl": dedup_ttl}
        return cls(
            keys=keys,
            redis=redis,
            conversations=ConversationStore(redis, keys, **ttls),
            markers=MarkerStore(redis, keys, **ttls),
            streams=StreamStore(redis, keys, mapping_ttl=mapping_ttl),
            deliveries=DeliveryStore(redis, keys, dedup_ttl=dedup_ttl),
            console=ConsoleStore(redis, keys, **ttls),
            deadlines=DeadlineStore(redis, keys),
        )


__all__ = [
    "Acquired",
    "ActionClaim",
    "AdmissionResult",
    "Claim",
    "ConnectionStore",
    "ConsoleStore",
    "ContextEntry",
    "ContextQuota",
    "ConversationState",
    "ConversationStore",
    "DeadlineStore",
    "DeliveryStore",
    "InboundAdmission",
    "InflightStream",
    "Keys",
    "LeaseState",
    "LeaseValue",
    "LiveMessage",
    "MarkerStore",
    "PendingAction",
    "RateWindow",
    "RedisClient",
    "RedisPy",
    "State",
    "StateError",
    "StreamStore",
    "TurnEnd",
    "TurnMode",
    "TurnRecord",
    "TurnStart",
    "close_redis_py",
    "context_entry_json",
    "listen",
    "message_seq",
    "note_message",
    "parse_redis_url",
    "pubsub",
    "redis_py_client",
    "redis_py_pool",
]
