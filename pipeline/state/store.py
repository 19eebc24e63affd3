"""Typed access to Switchboard's Redis state.

Every key is `<prefix><kind>:<ident>`. The kind is a fixed word of this module; the ident is one id
or, when several ids make it, a key built by `pipeline.records.join_ids` (a conversation key
`platform:bot:chat[:user]` is one), in which `:` only separates ids. So no id, whatever it
contains, can make one thing's key equal another's. TTLs: the conversation ↔ session mapping and
the conversation's state expire after `mapping_ttl` of inactivity (the next message starts a fresh
session); de-duplication markers after `dedup_ttl`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

ConversationStatus = Literal["idle", "running", "requires_action"]


class ContextEntry(BaseModel):
    """One recent group message, for the agent's context and the known mention targets."""

    model_config = ConfigDict(extra="ignore")

    message_id: str
    user_id: str
    name: str = ""
    text: str = ""
    at_ms: float = 0.0


class PendingAction(BaseModel):
    """A tool waiting on the chat: a confirmation (`ask`) or a custom tool result."""

    model_config = ConfigDict(extra="ignore")

    event_id: str
    kind: Literal["confirmation", "custom_tool"]
    name: str = ""
    input: dict[str, Any] = Field(default_factory=dict)
    session_thread_id: str | None = None


class TurnContext(BaseModel):
    """What render needs to know about the turn dispatch started."""

    model_config = ConfigDict(extra="ignore")

    trace_id: str
    platform: str
    bot_id: str
    chat_id: str
    chat_type: Literal["private", "group"]
    starter_id: str | None = None
    known_ids: list[str] = Field(default_factory=list)
    reply_to_message_id: str | None = None
    route: dict[str, str] = Field(default_factory=dict)
    hops: dict[str, float] = Field(default_factory=dict)
    inbound_ids: list[str] = Field(default_factory=list)


class ConversationState(BaseModel):
    model_config = ConfigDict(extra="ignore")

    status: ConversationStatus = "idle"
    session_id: str | None = None
    turn: TurnContext | None = None
    last_message: str | None = None
    last_message_id: str | None = None
    pending: list[PendingAction] = Field(default_factory=list)
    tools: dict[str, PendingAction] = Field(default_factory=dict)
    interrupted: bool = False
    held: int = 0
    # The last event id processed on this conversation's session stream (saved once per turn).
    cursor: str | None = None


@dataclass(frozen=True)
class InboundAdmission:
    """One inbound message for `StateStore.admit_inbound`."""

    dedup_id: str
    conversation: str
    entry: ContextEntry | None = None  # pushed onto the group-context window
    want_window: bool = False  # return the window as it was before this message
    mark: bool = False  # set the de-duplication marker now


@dataclass(frozen=True)
class AdmissionResult:
    duplicate: bool
    window: list[ContextEntry] = field(default_factory=list)


@dataclass
class InflightStream:
    """A session whose stream a worker must hold: routing and where to resume."""

    session_id: str
    conversation_key: str
    cursor: str | None = None
    trace_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class StateStore:
    def __init__(self, redis: Redis, prefix: str = "sb:", *, mapping_ttl: int = 7 * 86400, dedup_ttl: int = 86400):
        self.redis = redis
        self._hold_if_busy = redis.register_script(_HOLD_IF_BUSY)
        self._admit_inbound = redis.register_script(_ADMIT_INBOUND)
        self._append_console = redis.register_script(_APPEND_CONSOLE)
        self._push_turn = redis.register_script(_PUSH_TURN)
        self._bind_turn_end = redis.register_script(_BIND_TURN_END)
        self._idle_if_no_turn = redis.register_script(_IDLE_IF_NO_TURN)
        self.prefix = prefix
        self.mapping_ttl = mapping_ttl
        self.dedup_ttl = dedup_ttl

    def key(self, kind: str, ident: str) -> str:
        """`ident` runs to the end of the key: one id as it is, or several joined by `join_ids`."""
        return f"{self.prefix}{kind}:{ident}"

    # -- conversation ↔ session -------------------------------------------------------------
    async def session_for(self, conversation: str) -> str | None:
        value = await self.redis.get(self.key("c2s", conversation))
        return _text(value)

    async def conversation_for(self, session_id: str) -> str | None:
        return _text(await self.redis.get(self.key("s2c", session_id)))

    async def map_session(self, conversation: str, session_id: str) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self.key("c2s", conversation), session_id, ex=self.mapping_ttl)
            pipe.set(self.key("s2c", session_id), conversation, ex=self.mapping_ttl)
            pipe.hset(self.key("conv", conversation), "session_id", session_id)
            pipe.expire(self.key("conv", conversation), self.mapping_ttl)
            await pipe.execute()

    async def unmap_session(self, conversation: str, session_id: str | None = None) -> None:
        """Forget the conversation's session (terminal, deleted, /reset): the next message starts anew.

        Only unmaps if the mapping still names `session_id` (a newer session must survive a late
        notice about an older one).
        """
        current = await self.session_for(conversation)
        if session_id is not None and current is not None and current != session_id:
            await self.redis.delete(self.key("s2c", session_id))
            return
        keys = [
            self.key("c2s", conversation),
            self.key("conv", conversation),
            self.key("held", conversation),
            self.key("turns", conversation),
        ]
        if current:
            keys.append(self.key("s2c", current))
        if session_id and session_id != current:
            keys.append(self.key("s2c", session_id))
        await self.redis.delete(*keys)

    # -- conversation state -----------------------------------------------------------------
    async def conversation(self, conversation: str) -> ConversationState:
        return _conversation_state(await self.redis.hgetall(self.key("conv", conversation)))

    async def conversation_and_marker(
        self, conversation: str, kind: str, ident: str
    ) -> tuple[ConversationState, str | None]:
        """The conversation's state and one de-duplication marker, in one round trip."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.key("conv", conversation))
            pipe.get(self.key(f"dedup:{kind}", ident))
            raw, marker = await pipe.execute()
        return _conversation_state(raw), _text(marker)

    async def update_conversation(self, conversation: str, **fields: Any) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            self._queue_update(pipe, conversation, fields)
            await pipe.execute()

    def _queue_update(self, pipe: Any, conversation: str, fields: dict[str, Any]) -> None:
        """Queue on `pipe` the writes of `fields` to the conversation's hash (None deletes a field)."""
        mapping, deletes = _hash_fields(fields)
        key = self.key("conv", conversation)
        if mapping:
            pipe.hset(key, mapping=mapping)
        if deletes:
            pipe.hdel(key, *deletes)
        pipe.expire(key, self.mapping_ttl)

    # -- held messages (busy policies merge / queue) ------------------------------------------
    async def hold_if_busy(self, conversation: str, command_json: str) -> bool:
        """Hold the command if a turn is running, atomically with that check.

        Render ends a turn (status idle) and reads the held count in one transaction; this script
        checks the status and holds in one step. So a message is either held before the turn ends
        (and the end flushes it) or sees the idle state (and starts its own turn): never stranded.
        """
        held = await self._hold_if_busy(
            keys=[self.key("conv", conversation), self.key("held", conversation)],
            args=[command_json, self.mapping_ttl],
        )
        return bool(held)

    async def finish_turn(self, conversation: str, marker_id: str | None, **fields: Any) -> int:
        """End a turn: write `fields`, mark its end event handled, and set the status idle unless
        the session still has turns sent to it (those run next; held messages wait for them).
        Returns how many messages are held, to flush, or -1 when turns remain (nothing to flush
        yet). One transaction, so a message is held before the status turns idle or sees it."""
        fields.pop("status", None)  # decided here, by the turns the session still has

        def build(pipe: Any) -> None:
            self._queue_update(pipe, conversation, fields)
            if marker_id:
                pipe.set(self.key("dedup:turnend", marker_id), "1", ex=self.dedup_ttl)
            keys = [self.key("conv", conversation), self.key("turns", conversation), self.key("held", conversation)]
            pipe.evalsha(self._idle_if_no_turn.sha, len(keys), *keys)

        results = await self._transaction(build)
        return int(results[-1])

    async def _transaction(self, build: Callable[[Any], None]) -> list[Any]:
        """Run a MULTI/EXEC built by `build` that calls scripts by their sha. redis-py would check
        with SCRIPT EXISTS before every such pipeline (a round trip each); instead a script Redis
        lost (a restart without AOF, SCRIPT FLUSH) is loaded again and the whole transaction,
        idempotent by construction, runs once more."""
        for attempt in range(2):
            async with self.redis.pipeline(transaction=True) as pipe:
                build(pipe)
                try:
                    result: list[Any] = await pipe.execute()
                    return result
                except NoScriptError:
                    if attempt:
                        raise
                    for script in (self._push_turn, self._idle_if_no_turn):
                        await self.redis.script_load(script.script)
        raise AssertionError("unreachable")

    # -- turns sent to the session, oldest first --------------------------------------------------
    # The session runs user messages in the order it accepted them and ends each with an idle, so
    # an idle belongs to the oldest turn not yet ended: not to "the current turn" in the state,
    # which a later turn may already have replaced when an idle is replayed or arrives late.
    async def bind_turn_end(self, conversation: str, event_id: str | None) -> TurnContext | None:
        """The turn an idle ends: the oldest turn sent and not yet ended (taken off the list), or
        the one this same idle was bound to before (a replay). None when no turn is known."""
        raw = await self._bind_turn_end(
            keys=[self.key("turns", conversation), self.key("dedup:turnbind", event_id or "")],
            args=[self.dedup_ttl, 1 if event_id else 0, self.key("turn", "")],
        )
        return TurnContext.model_validate_json(raw) if raw else None

    async def drop_turn(self, conversation: str, turn_id: str) -> int:
        """Forget a turn whose send failed; returns how many turns remain."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lrem(self.key("turns", conversation), 0, turn_id)
            pipe.llen(self.key("turns", conversation))
            _, remaining = await pipe.execute()
        return int(remaining)

    async def turns_in_session(self, conversation: str) -> list[str]:
        return [_text(v) or "" for v in await self.redis.lrange(self.key("turns", conversation), 0, -1)]

    async def peek_held(self, conversation: str, limit: int | None = None) -> list[str]:
        """The oldest `limit` held commands (all when None), left in place until `drop_held`."""
        end = -1 if limit is None else limit - 1
        return [_text(v) or "" for v in await self.redis.lrange(self.key("held", conversation), 0, end)]

    async def drop_held(self, conversation: str, count: int) -> None:
        """Remove the `count` oldest held commands (after the turn that carries them was sent)."""
        if count <= 0:
            return
        key = self.key("held", conversation)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpop(key, count)
            pipe.llen(key)
            _, remaining = await pipe.execute()
        await self.redis.hset(self.key("conv", conversation), "held", int(remaining))

    async def take_held(self, conversation: str, limit: int | None = None) -> list[str]:
        """Remove and return up to `limit` held commands (all when None), oldest first."""
        key = self.key("held", conversation)
        async with self.redis.pipeline(transaction=True) as pipe:
            if limit is None:
                pipe.lrange(key, 0, -1)
                pipe.delete(key)
            else:
                pipe.lpop(key, limit)
            pipe.llen(key)
            results = await pipe.execute()
        taken = [_text(v) or "" for v in (results[0] or [])]
        remaining = int(results[-1])
        await self.redis.hset(self.key("conv", conversation), "held", remaining)
        return taken

    # -- de-duplication markers ---------------------------------------------------------------
    async def first_time(self, kind: str, ident: str, ttl: int | None = None) -> bool:
        """True the first time `ident` is seen (sets the marker atomically)."""
        return bool(await self.redis.set(self.key(f"dedup:{kind}", ident), "1", nx=True, ex=ttl or self.dedup_ttl))

    async def marker(self, kind: str, ident: str) -> str | None:
        return _text(await self.redis.get(self.key(f"dedup:{kind}", ident)))

    async def set_marker(self, kind: str, ident: str, value: str = "1", ttl: int | None = None) -> None:
        await self.redis.set(self.key(f"dedup:{kind}", ident), value, ex=ttl or self.dedup_ttl)

    async def clear_marker(self, kind: str, ident: str) -> None:
        await self.redis.delete(self.key(f"dedup:{kind}", ident))

    # -- streams in flight, per partition -------------------------------------------------------
    async def add_inflight(self, partition: int, stream: InflightStream) -> None:
        await self.redis.hset(self.key("inflight", str(partition)), stream.session_id, _dump_inflight(stream))

    async def remove_inflight(self, partition: int, session_id: str) -> None:
        await self.redis.hdel(self.key("inflight", str(partition)), session_id)

    async def inflight(self, partition: int) -> list[InflightStream]:
        raw = await self.redis.hgetall(self.key("inflight", str(partition)))
        streams = []
        for session_id, value in raw.items():
            data = json.loads(_text(value) or "{}")
            streams.append(
                InflightStream(
                    session_id=_text(session_id) or "",
                    conversation_key=data.get("conversation_key", ""),
                    cursor=data.get("cursor"),
                    trace_id=data.get("trace_id"),
                    extra=data.get("extra") or {},
                )
            )
        return streams

    # -- stream cursors (the last event id processed, kept in the conversation's hash) -------------
    async def save_session_cursor(
        self, conversation: str, session_id: str, cursor: str, *, release_partition: int | None = None
    ) -> None:
        """Save the stream's cursor; with `release_partition`, also take the session off the
        partition's in-flight set (its turn is over) in the same round trip."""
        key = self.key("conv", conversation)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hset(key, "cursor", f"{session_id}|{cursor}")
            pipe.expire(key, self.mapping_ttl)
            if release_partition is not None:
                pipe.hdel(self.key("inflight", str(release_partition)), session_id)
            await pipe.execute()

    async def start_turn(
        self, conversation: str, partition: int, stream: InflightStream, *, turn_id: str | None = None, **fields: Any
    ) -> None:
        """Mark the turn running and the session's stream in flight, in one round trip. With
        `turn_id` (a new user message) the turn joins the session's list of turns, once, and its
        context (`fields["turn"]`) is kept under its id for the idle that will end it."""

        def build(pipe: Any) -> None:
            self._queue_update(pipe, conversation, fields)
            pipe.hset(self.key("inflight", str(partition)), stream.session_id, _dump_inflight(stream))
            if turn_id:
                turn = fields.get("turn")
                if isinstance(turn, TurnContext):
                    pipe.set(self.key("turn", turn_id), turn.model_dump_json(), ex=self.mapping_ttl)
                pipe.evalsha(self._push_turn.sha, 1, self.key("turns", conversation), turn_id, self.mapping_ttl)

        await self._transaction(build)

    async def claim_send(self, marker_id: str) -> str | None:
        """Before a send: the marker's previous value (None: first attempt, now marked `sending`)."""
        key = self.key("dedup:sent", marker_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.set(key, "sending", nx=True, ex=self.dedup_ttl)
            previous, _ = await pipe.execute()
        return _text(previous)

    async def markers(self, kind: str, idents: list[str]) -> list[str | None]:
        if not idents:
            return []
        values = await self.redis.mget([self.key(f"dedup:{kind}", i) for i in idents])
        return [_text(v) for v in values]

    async def set_markers(self, kind: str, idents: list[str], value: str = "1", ttl: int | None = None) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            for ident in idents:
                pipe.set(self.key(f"dedup:{kind}", ident), value, ex=ttl or self.dedup_ttl)
            await pipe.execute()

    # -- inbound admission (ingest, one round trip per batch) -----------------------------------
    async def admit_inbound(self, items: list[InboundAdmission], context_size: int) -> list[AdmissionResult]:
        """De-duplicate a batch of inbound messages and keep the group-context window, in one
        atomic round trip and in the given order.

        Per item: a duplicate (its marker exists) changes nothing. Otherwise the window before the
        message is returned when asked for, the message is pushed onto its chat's window when it
        carries an entry, and its marker is set when `mark` (a message that produces nothing can
        be marked at once; one that produces is marked only after the broker has its output).
        """
        if not items:
            return []
        keys: list[str] = []
        args: list[Any] = [self.dedup_ttl, max(context_size, 0), self.mapping_ttl]
        for item in items:
            keys.append(self.key("dedup:in", item.dedup_id))
            keys.append(self.key("ctx", item.conversation))
            push = item.entry is not None and context_size > 0
            read = item.want_window and context_size > 0
            args.append(("w" if read else "") + ("p" if push else "") + ("m" if item.mark else "") or "-")
            args.append(item.entry.model_dump_json() if push and item.entry is not None else "")
        raw = await self._admit_inbound(keys=keys, args=args)
        results = []
        for reply in raw:
            duplicate = int(reply[0]) == 0
            window = _window(reply[1:]) if not duplicate else []
            results.append(AdmissionResult(duplicate=duplicate, window=window))
        return results

    # -- group-context window -----------------------------------------------------------------
    async def context(self, conversation: str, size: int) -> list[ContextEntry]:
        """The window, oldest first."""
        if size <= 0:
            return []
        return _window(await self.redis.lrange(self.key("ctx", conversation), 0, size - 1))

    # -- console deliveries ---------------------------------------------------------------------
    async def append_console(
        self, bot_id: str, chat_id: str, payload: str, cap: int = 500, *, message_id: str | None = None
    ) -> int:
        """Append to a console chat. With `message_id` the append happens at most once per id (the
        console's own idempotency, like Lark's `uuid`): returns 0 when it was posted before."""
        key = self.key("console", f"{bot_id}:{chat_id}")
        posted = self.key("console-posted", message_id) if message_id else ""
        count = await self._append_console(
            keys=[key, self.key("console-live", bot_id), posted],
            args=[payload, cap, self.mapping_ttl, chat_id, self.dedup_ttl],
        )
        return int(count)

    async def console_messages(self, bot_id: str, chat_id: str) -> list[str]:
        raw = await self.redis.lrange(self.key("console", f"{bot_id}:{chat_id}"), 0, -1)
        return [_text(v) or "" for v in raw]


_HOLD_IF_BUSY = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or status == 'idle' then return 0 end
redis.call('RPUSH', KEYS[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'held', 1)
return 1
"""


# Per item i: KEYS[2i-1] its marker, KEYS[2i] its chat's window; ARGV[2+2i] flags (w: return the
# window, p: push ARGV[3+2i], m: set the marker). ARGV[1..3]: marker TTL, window size, window TTL.
_ADMIT_INBOUND = """
local marker_ttl, size, window_ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 1, #KEYS / 2 do
  local marker, window = KEYS[2 * i - 1], KEYS[2 * i]
  local flags, entry = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  if redis.call('EXISTS', marker) == 1 then
    out[i] = {0}
  else
    local reply = {1}
    if string.find(flags, 'w', 1, true) then
      for _, v in ipairs(redis.call('LRANGE', window, 0, size - 1)) do reply[#reply + 1] = v end
    end
    if string.find(flags, 'p', 1, true) then
      redis.call('LPUSH', window, entry)
      redis.call('LTRIM', window, 0, size - 1)
      redis.call('EXPIRE', window, window_ttl)
    end
    if string.find(flags, 'm', 1, true) then
      redis.call('SET', marker, '1', 'EX', marker_ttl)
    end
    out[i] = reply
  end
end
return out
"""


# KEYS: the chat's list, its live channel, the posted marker ('' for none). ARGV: payload, cap, list
# TTL, chat id, marker TTL.
_APPEND_CONSOLE = """
if KEYS[3] ~= '' and not redis.call('SET', KEYS[3], '1', 'NX', 'EX', ARGV[5]) then return 0 end
local count = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('PUBLISH', KEYS[2], ARGV[4])
return count
"""


# The session's turns (KEYS[1]): append ARGV[1] unless it is there already (a replayed dispatch).
_PUSH_TURN = """
for _, id in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  if id == ARGV[1] then return 0 end
end
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: the session's turns, this idle's binding. ARGV: binding TTL, whether the idle has an id,
# the prefix of turn-context keys. Returns the bound turn's context (false when none is known).
_BIND_TURN_END = """
local turn = false
if ARGV[2] == '1' then turn = redis.call('GET', KEYS[2]) end
if not turn then
  turn = redis.call('LPOP', KEYS[1])
  if not turn then return false end
  if ARGV[2] == '1' then redis.call('SET', KEYS[2], turn, 'EX', ARGV[1]) end
end
return redis.call('GET', ARGV[3] .. turn)
"""

# KEYS: conversation hash, the session's turns, held messages.
_IDLE_IF_NO_TURN = """
if redis.call('LLEN', KEYS[2]) > 0 then return -1 end
redis.call('HSET', KEYS[1], 'status', 'idle')
return redis.call('LLEN', KEYS[3])
"""


def _window(raw: list[Any]) -> list[ContextEntry]:
    """Window entries (newest first in Redis) oldest first, each message once: a message replayed
    after a crash may have been pushed twice."""
    seen: set[str] = set()
    entries: list[ContextEntry] = []
    for value in reversed(raw):
        entry = ContextEntry.model_validate_json(value)
        if entry.message_id not in seen:
            seen.add(entry.message_id)
            entries.append(entry)
    return entries


def _conversation_state(raw: dict[Any, Any]) -> ConversationState:
    if not raw:
        return ConversationState()
    data = {_text(k): _text(v) for k, v in raw.items()}
    return ConversationState(
        status=data.get("status") or "idle",
        session_id=data.get("session_id"),
        turn=TurnContext.model_validate_json(data["turn"] or "") if data.get("turn") else None,
        last_message=data.get("last_message"),
        last_message_id=data.get("last_message_id"),
        pending=[PendingAction.model_validate(p) for p in json.loads(data.get("pending") or "[]")],
        tools={k: PendingAction.model_validate(v) for k, v in json.loads(data.get("tools") or "{}").items()},
        interrupted=data.get("interrupted") == "1",
        held=int(data.get("held") or 0),
        cursor=_cursor_for(data.get("cursor"), data.get("session_id")),
    )


def _hash_fields(fields: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    """Conversation-hash fields as strings; None means delete the field."""
    mapping: dict[str, str] = {}
    deletes: list[str] = []
    for name, value in fields.items():
        if value is None:
            deletes.append(name)
        elif isinstance(value, BaseModel):
            mapping[name] = value.model_dump_json()
        elif isinstance(value, bool):
            mapping[name] = "1" if value else "0"
        elif isinstance(value, list):
            mapping[name] = json.dumps([v.model_dump() if isinstance(v, BaseModel) else v for v in value])
        elif isinstance(value, dict):
            mapping[name] = json.dumps({k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in value.items()})
        else:
            mapping[name] = str(value)
    return mapping, deletes


def _cursor_for(stored: str | None, session_id: str | None) -> str | None:
    if not stored or not session_id:
        return None
    owner, _, cursor = stored.partition("|")
    return cursor if owner == session_id else None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def _dump_inflight(stream: InflightStream) -> str:
    return json.dumps(
        {
            "conversation_key": stream.conversation_key,
            "cursor": stream.cursor,
            "trace_id": stream.trace_id,
            "extra": stream.extra,
        }
    )
