"""The stores' client on a Redis Cluster: each call goes to the primary serving its keys' slot.

One pipelining `RedisClient` per primary (the same connection, parsing and failure handling as on
one server); the slot map comes from `CLUSTER SLOTS`, asked of any known node (the URL's first).

- A script, a transaction or a single-key command names keys of one slot (the stores see to it:
  `Keys` hash tags), and goes to that slot's primary.
- A pipeline is split per primary: one request to each, sent together, replies put back in order.
- A transaction whose keys span slots runs as one transaction per slot, sent together: atomic per
  slot only (the stores' own transactions keep to one slot).
- `MGET` and `DEL` over several slots are split per slot the same way (not atomic: none needs it).

Failures keep the single server's contract, redis-py's exception types: a lost node fails its calls
with `ConnectionError` (the stages retry) and the slot map is asked for again before the next call,
so once the cluster has promoted a replica the calls go there. `MOVED` (the map is stale) refreshes
the map and the call is sent again when Redis ran none of it (a command, script or transaction);
`CLUSTERDOWN`, `TRYAGAIN` and `ASK` (a failover or a resharding under way) are `ConnectionError`s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline.state.exceptions import StateError
from pipeline.state.redis_url import ClusterTarget, Endpoint

if TYPE_CHECKING:
    from pipeline.state.client import Arg, RedisClient, Script

log = logging.getLogger(__name__)

T = TypeVar("T")
Address = tuple[str, int]

SLOTS = 16384
# Commands whose every argument after the name is a key (split per slot when they span several).
_ALL_KEYS = {"MGET", "DEL", "UNLINK", "EXISTS"}
# Commands that name no key: any primary answers them.
_NO_KEY = {"PUBLISH", "PING", "SCRIPT", "CLIENT", "INFO", "TIME", "DBSIZE"}
# Seconds at least between two asks for the slot map while nodes fail (a failover takes seconds).
_REFRESH_INTERVAL = 0.1


def slot_of(key: str) -> int:
    return int(key_slot(key.encode()))


class ClusterRouter:
    def __init__(self, target: ClusterTarget, node_client: Callable[[Endpoint], RedisClient]) -> None:
        self.target = target
        self._node_client = node_client
        self._nodes: dict[Address, RedisClient] = {}
        self._slots: list[Address] | None = None
        self._stale = True
        self._refreshing: asyncio.Future[None] | None = None
        self._last_refresh = 0.0
        self._written: set[Address] = set()

    # -- calls -------------------------------------------------------------------------------------
    async def execute(self, args: Sequence[Arg]) -> Any:
        name = str(args[0]).upper()
        if name in _ALL_KEYS and len(args) > 2:
            by_slot = _group([(slot_of(str(k)), i) for i, k in enumerate(args[1:])])
            if len(by_slot) > 1:
                parts = await asyncio.gather(
                    *(self.execute((args[0], *(args[1 + i] for i in items))) for items in by_slot.values())
                )
                if name == "MGET":
                    return _merge(by_slot, parts, len(args) - 1)
                return sum(int(p) for p in parts)
        slot = slot_of(str(args[1])) if len(args) > 1 and name not in _NO_KEY else 0
        return await self._call(slot, lambda node: node.execute(*args), resend=True)

    async def pipeline(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        """One request per primary, sent together. A `MOVED` (the map was stale) is a
        `ConnectionError` once the map is refreshed: part of a request may have run, and the
        stages' retry re-runs the whole step, which their stable ids make harmless."""
        if not commands:
            return []
        await self._ready()
        by_node = _group([(self._address(_command_slot(c)), i) for i, c in enumerate(commands)])
        parts = await asyncio.gather(
            *(self._call_node(address, _pipeline([commands[i] for i in items])) for address, items in by_node.items()),
            return_exceptions=True,
        )
        for part in parts:
            if isinstance(part, BaseException):
                raise part
        return _merge(by_node, parts, len(commands))

    async def transaction(self, commands: Sequence[Sequence[Arg]]) -> list[Any]:
        by_slot = _group([(_command_slot(c), i) for i, c in enumerate(commands)])
        parts = await asyncio.gather(
            *(
                self._call(slot, _transaction([commands[i] for i in items]), resend=True)
                for slot, items in by_slot.items()
            )
        )
        return _merge(by_slot, parts, len(commands))

    async def run_script(self, script: Script, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        slots = {slot_of(k) for k in keys}
        if len(slots) > 1:
            raise ValueError(f"a script's keys span {len(slots)} hash slots (the keys lack a common hash tag)")
        slot = slots.pop() if slots else 0
        return await self._call(slot, lambda node: node.run_script(script, keys, args), resend=True)

    async def replicated(self) -> None:
        """`WAIT` on every primary written to since the last time (see `RedisClient.replicated`)."""
        written, self._written = self._written, set()
        await asyncio.gather(*(self._nodes[a].replicated() for a in written if a in self._nodes))

    async def aclose(self) -> None:
        for node in self._nodes.values():
            await node.aclose()
        self._nodes.clear()

    # -- routing -----------------------------------------------------------------------------------
    async def _call(self, slot: int, call: Callable[[RedisClient], Awaitable[T]], *, resend: bool) -> T:
        await self._ready()
        try:
            return await self._call_node(self._address(slot), call)
        except _Moved:
            if not resend:
                raise
            await self._ready()  # the map just marked stale: asked again
            return await self._call_node(self._address(slot), call)

    async def _call_node(self, address: Address, call: Callable[[RedisClient], Awaitable[T]]) -> T:
        self._written.add(address)
        try:
            return await call(self._node(address))
        except (RedisConnectionError, RedisTimeoutError):
            self._stale = True  # a node lost or demoted: its replica may be promoted by now
            raise
        except ResponseError as exc:
            message = str(exc)
            if "MOVED" in message:
                self._stale = True
                raise _Moved(message) from exc
            if message.startswith(("CLUSTERDOWN", "TRYAGAIN", "ASK ")) or "EXECABORT" in message:
                self._stale = True
                raise RedisConnectionError(f"Redis Cluster busy ({message.split(' ', 1)[0]}): retry") from exc
            raise

    def _address(self, slot: int) -> Address:
        assert self._slots is not None
        return self._slots[slot]

    def _node(self, address: Address) -> RedisClient:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = self._node_client(self.target.node(*address))
        return node

    async def _ready(self) -> None:
        if not self._stale and self._slots is not None:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._refresh())
        refreshing = self._refreshing
        try:
            await asyncio.shield(refreshing)
        finally:
            if refreshing.done():
                self._refreshing = None

    async def _refresh(self) -> None:
        """The slot map from the first node that gives a full one: known primaries, then the URL's."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, self._last_refresh + _REFRESH_INTERVAL - loop.time()))
        self._last_refresh = loop.time()
        problems: list[str] = []
        candidates = list(dict.fromkeys([*self._nodes, *self.target.nodes]))
        for address in candidates:
            try:
                reply = await self._node(address).execute("CLUSTER", "SLOTS")
                slots = _slot_map(reply, address)
            except (RedisConnectionError, RedisTimeoutError, ResponseError, ValueError) as exc:
                problems.append(f"{address[0]}:{address[1]}: {exc}")
                continue
            self._slots = slots
            self._stale = False
            return
        raise RedisConnectionError(f"no node of {self.target.address} gave the slot map: {'; '.join(problems)}")


class _Moved(StateError, RedisConnectionError):
    """A `MOVED` reply: the slot map was stale (a `ConnectionError` to the stages)."""


def _pipeline(commands: list[Sequence[Arg]]) -> Callable[[RedisClient], Awaitable[list[Any]]]:
    return lambda node: node.pipeline(commands)


def _transaction(commands: list[Sequence[Arg]]) -> Callable[[RedisClient], Awaitable[list[Any]]]:
    return lambda node: node.transaction(commands)


def _command_slot(command: Sequence[Arg]) -> int:
    return slot_of(str(command[1])) if len(command) > 1 and str(command[0]).upper() not in _NO_KEY else 0


def _slot_map(reply: list[Any], asked: Address) -> list[Address]:
    slots: list[Address | None] = [None] * SLOTS
    for entry in reply:
        start, end, primary = int(entry[0]), int(entry[1]), entry[2]
        address = (str(primary[0]) or asked[0], int(primary[1]))
        slots[start : end + 1] = [address] * (end + 1 - start)
    missing = slots.count(None)
    if missing:
        raise ValueError(f"{missing} hash slots have no primary (the cluster is not fully set up)")
    return slots  # type: ignore[return-value]  # no None left


def _group(pairs: list[tuple[Any, int]]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = {}
    for group, position in pairs:
        groups.setdefault(group, []).append(position)
    return groups


def _merge(groups: dict[Any, list[int]], parts: Sequence[Any], size: int) -> list[Any]:
    """Replies per group back in the order of the request."""
    merged: list[Any] = [None] * size
    for positions, replies in zip(groups.values(), parts, strict=True):
        for position, reply in zip(positions, replies, strict=True):
            merged[position] = reply
    return merged
