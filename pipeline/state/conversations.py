"""Conversations and their turns: the conversation ↔ session mapping, the turn state machine's
state, the user turns sent to a session, messages held while it is busy, the group-context window.

The two hot steps are one script each: dispatch's `begin_turn` (dedup, busy policy, claim, record)
and render's `bind_turn_end` + `finish_turn` (which turn an idle ends; the end written once the
turn's output is in the broker).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any, Literal, TypeVar

from redis.exceptions import NoScriptError

from . import scripts
from ._codec import conversation_state, hash_fields, text, window
from .client import RedisClient
from .keys import Keys
from .models import ContextEntry, ConversationState, InflightStream, TurnEnd, TurnRecord, TurnStart

T = TypeVar("T")

TurnMode = Literal["merge", "queue", "interrupt", "flush", "resume"]

_BEGIN_TURN = scripts.script("begin_turn")
_BIND_TURN_END = scripts.script("bind_turn_end")
_FINISH_TURN = scripts.script("finish_turn")
_DROP_HELD = scripts.script("drop_held")


class ConversationStore:
    def __init__(self, redis: RedisClient, keys: Keys, *, mapping_ttl: int, dedup_ttl: int) -> None:
        self.redis = redis
        self.keys = keys
        self.mapping_ttl = mapping_ttl
        self.dedup_ttl = dedup_ttl

    # -- conversation ↔ session -------------------------------------------------------------
    async def session_for(self, conversation: str) -> str | None:
        return text(await self.redis.execute("GET", self.keys.session_of(conversation)))

    async def map_session(self, conversation: str, session_id: str) -> None:
        """Name the conversation's session (dispatch does it with the turn's start: `begin_turn`'s
        `new_session`)."""
        k, ttl = self.keys, self.mapping_ttl
        await self.redis.transaction(
            [
                ("SET", k.session_of(conversation), session_id, "EX", ttl),
                ("HSET", k.conversation(conversation), "session_id", session_id),
                ("EXPIRE", k.conversation(conversation), ttl),
            ]
        )

    async def unmap_session(self, conversation: str, session_id: str | None = None) -> None:
        """Forget the conversation's session (terminal, deleted, /reset): the next message starts
        anew. Only when the mapping still names `session_id`: a newer session must survive a late
        notice about an older one."""
        k = self.keys
        current = await self.session_for(conversation)
        if session_id is not None and current is not None and current != session_id:
            return
        doomed = [k.session_of(conversation), k.conversation(conversation), k.held(conversation), k.turns(conversation)]
        await self.redis.execute("DEL", *doomed)

    # -- conversation state -----------------------------------------------------------------
    async def conversation(self, conversation: str) -> ConversationState:
        return conversation_state(await self.redis.execute("HGETALL", self.keys.conversation(conversation)))

    async def update_conversation(self, conversation: str, **fields: Any) -> None:
        await self.redis.transaction(self._writes(conversation, fields))

    async def resume_turn(self, conversation: str, partition: int, stream: InflightStream, **fields: Any) -> None:
        """A turn continues (a confirmation or tool result was sent): write `fields` and hold the
        session's stream again, in one round trip."""
        writes = self._writes(conversation, fields)
        writes.append(("HSET", self.keys.inflight(partition, conversation), stream.session_id, inflight_entry(stream)))
        await self._indexed(self.redis.transaction(writes), partition, conversation)

    async def _indexed(self, write: Awaitable[T], partition: int, conversation: str) -> T:
        """`write` (which may put a stream in flight); on a cluster, along with it, the conversation
        listed in the partition's in-flight index (its own slot) so that a partition's new owner
        finds the stream. The record is acknowledged only when both are done, and a replay writes
        both again."""
        if not self.keys.cluster:
            return await write
        index = self.keys.inflight_index(partition)
        listed = self.redis.pipeline([("SADD", index, conversation), ("EXPIRE", index, self.mapping_ttl)])
        result, _ = await asyncio.gather(write, listed)
        return result

    def _writes(self, conversation: str, fields: dict[str, Any]) -> list[tuple[Any, ...]]:
        """The commands that write `fields` to the conversation's hash (None deletes a field)."""
        key = self.keys.conversation(conversation)
        mapping, deletes = hash_fields(fields)
        writes: list[tuple[Any, ...]] = []
        if mapping:
            writes.append(("HSET", key, *(v for pair in mapping.items() for v in pair)))
        if deletes:
            writes.append(("HDEL", key, *deletes))
        writes.append(("EXPIRE", key, self.mapping_ttl))
        return writes

    # -- user turns ----------------------------------------------------------------------------
    async def begin_turn(
        self,
        conversation: str,
        partition: int,
        *,
        turn_id: str,
        mode: TurnMode,
        turn: TurnRecord,
        command_json: str | None,
        trace_id: str,
        inbound_markers: Sequence[str] = (),
        note: tuple[str, str] | None = None,
        new_session: str | None = None,
        can_cut: bool = False,
        start_note: str | None = None,
    ) -> TurnStart:
        """Decide what a user turn does, and record it when it starts, in one step (see
        `scripts/begin_turn.lua`): a replay is recognised, a busy session holds it (merge, queue),
        and a starting turn is recorded as running, listed among the session's turns, its record
        kept under its id, its stream in flight on `partition`, its inbound messages marked seen.
        `command_json` is what a busy session holds; without it, a turn that would be held comes
        back as `hold` and nothing is written (call again with it).
        `note` (a channel, a message) is published when the turn is newly held, or started by a
        flush, in the same step: the console's status notes cost no round trip of their own.
        `new_session`, after a `no_session` decision: the session just created, mapped to the
        conversation in the same step unless one is mapped already (which then carries the turn).
        `can_cut`: the caller can take messages out of this turn (`without_messages`), so a turn some
        of whose messages another turn already took comes back as `partial`, naming them (`taken`).
        `start_note` is published on the note's channel when a merge or queue turn starts."""
        keys, args = self._begin_turn_call(
            conversation,
            partition,
            turn_id=turn_id,
            mode=mode,
            turn=turn,
            command_json=command_json,
            trace_id=trace_id,
            inbound_markers=inbound_markers,
            note=note,
            new_session=new_session,
            can_cut=can_cut,
            start_note=start_note,
        )
        raw = await self._indexed(self.redis.run_script(_BEGIN_TURN, keys, args), partition, conversation)
        return _turn_start(raw)

    async def begin_turns(self, conversation: str, partition: int, calls: Sequence[dict[str, Any]]) -> list[TurnStart]:
        """Several `begin_turn`s of one conversation (each call's keyword arguments), decided in
        order, each in one step as `begin_turn` does, in one round trip: a chat's messages that
        arrive together while its session is busy are held for the price of one call. On a cluster
        (the calls' keys are hash-tagged to the conversation's slot, but the index is not) they go
        one after another."""
        if self.keys.cluster:
            return [await self.begin_turn(conversation, partition, **call) for call in calls]
        commands: list[tuple[Any, ...]] = []
        for call in calls:
            keys, args = self._begin_turn_call(conversation, partition, **call)
            commands.append(("EVALSHA", _BEGIN_TURN.sha, len(keys), *keys, *args))
        try:
            replies = await self.redis.pipeline(commands)
        except NoScriptError:  # Redis lost its scripts (a restart): the first call loads it again
            first = await self.begin_turn(conversation, partition, **calls[0])
            return [first, *await self.begin_turns(conversation, partition, calls[1:])] if calls[1:] else [first]
        return [_turn_start(raw) for raw in replies]

    def _begin_turn_call(
        self,
        conversation: str,
        partition: int,
        *,
        turn_id: str,
        mode: TurnMode,
        turn: TurnRecord,
        command_json: str | None,
        trace_id: str,
        inbound_markers: Sequence[str] = (),
        note: tuple[str, str] | None = None,
        new_session: str | None = None,
        can_cut: bool = False,
        start_note: str | None = None,
    ) -> tuple[list[str], list[Any]]:
        """The keys and arguments of `scripts/begin_turn.lua` for one turn."""
        k = self.keys
        stream = InflightStream(session_id="", conversation_key=conversation, trace_id=trace_id)
        keys = [
            k.conversation(conversation),
            k.held(conversation),
            k.turns(conversation),
            k.turn(turn_id, conversation),
            k.inflight(partition, conversation),
            k.marker("sent", turn_id, conversation),
            k.session_of(conversation),
            *(k.marker("in", m, conversation) for m in inbound_markers),
        ]
        args = [
            turn_id,
            f"{turn_id}\n{command_json}" if command_json is not None else "",
            mode,
            turn.model_dump_json(),
            inflight_entry(stream),
            self.mapping_ttl,
            self.dedup_ttl,
            *(note or ("", "")),
            new_session or "",
            "1" if can_cut else "",
            start_note or "",
        ]
        return keys, args

    async def drop_turn(self, conversation: str, turn_id: str) -> int:
        """Forget a turn whose send failed; returns how many turns remain."""
        key = self.keys.turns(conversation)
        _, remaining = await self.redis.transaction([("LREM", key, 0, turn_id), ("LLEN", key)])
        return int(remaining)

    async def turns_in_session(self, conversation: str) -> list[str]:
        return [text(v) or "" for v in await self.redis.execute("LRANGE", self.keys.turns(conversation), 0, -1)]

    async def turn(self, turn_id: str, conversation: str) -> TurnRecord | None:
        """A sent turn's record (kept for `mapping_ttl`, after its end too)."""
        raw = text(await self.redis.execute("GET", self.keys.turn(turn_id, conversation)))
        return TurnRecord.model_validate_json(raw) if raw else None

    # -- turn ends (render) --------------------------------------------------------------------
    async def bind_turn_end(self, conversation: str, event_id: str | None, *, bind: bool) -> TurnEnd:
        """Whether this idle was handled before, the conversation's state and, with `bind`, the
        turn it ends: the oldest sent and not yet ended (taken off the list), or the turn this same
        idle was bound to before (a replay)."""
        k = self.keys
        handled, raw_state, turn_id, raw_turn = await self.redis.run_script(
            _BIND_TURN_END,
            [
                k.conversation(conversation),
                k.turns(conversation),
                k.marker("turnbind", event_id, conversation) if event_id else k.absent(conversation),
                k.marker("turnend", event_id, conversation) if event_id else k.absent(conversation),
            ],
            [k.turn_prefix(conversation), self.dedup_ttl, "1" if bind else "0"],
        )
        return TurnEnd(
            handled=text(handled),
            state=conversation_state(raw_state or []),
            turn_id=text(turn_id),
            turn=TurnRecord.model_validate_json(raw_turn) if raw_turn else None,
        )

    async def finish_turn(
        self,
        conversation: str,
        partition: int,
        *,
        session_id: str,
        event_id: str | None,
        turn_id: str | None,
        waiting: bool = False,
        **fields: Any,
    ) -> int:
        """Write a turn's end once its output is in the broker (see `scripts/finish_turn.lua`):
        `fields`, the stream's cursor, the ended turn's send confirmed, the idle marked handled, and
        the status idle and the stream released unless sent turns remain (`waiting`: the session
        waits on the chat; the stream is released, the status is in `fields`). Returns how many
        held messages to flush (-1: turns remain)."""
        k = self.keys
        mapping, deletes = hash_fields(fields)
        flat = [v for pair in mapping.items() for v in pair]
        result = await self.redis.run_script(
            _FINISH_TURN,
            [
                k.conversation(conversation),
                k.turns(conversation),
                k.held(conversation),
                k.marker("turnend", event_id, conversation) if event_id else k.absent(conversation),
                k.marker("sent", turn_id, conversation) if turn_id else k.absent(conversation),
                k.inflight(partition, conversation),
            ],
            [
                self.mapping_ttl,
                self.dedup_ttl,
                session_id,
                event_id or "",
                "wait" if waiting else "end",
                len(mapping),
                *flat,
                *deletes,
            ],
        )
        return int(result)

    async def context(self, conversation: str, size: int) -> list[ContextEntry]:
        """The group-context window, oldest first (kept by ingest's admission)."""
        if size <= 0:
            return []
        return window(await self.redis.execute("LRANGE", self.keys.window(conversation), 0, size - 1))

    # -- held messages (busy policies merge / queue) ------------------------------------------
    async def peek_held(self, conversation: str, limit: int | None = None) -> list[tuple[str, str]]:
        """The oldest `limit` held commands (all when None) as (turn id, command JSON), left in
        place until `drop_held`."""
        end = -1 if limit is None else limit - 1
        held = []
        for raw in await self.redis.execute("LRANGE", self.keys.held(conversation), 0, end):
            turn_id, _, command = (text(raw) or "").partition("\n")
            held.append((turn_id, command))
        return held

    async def drop_held(self, conversation: str, count: int) -> None:
        """Remove the `count` oldest held commands (after the turn that carries them was sent)."""
        if count <= 0:
            return
        await self.redis.run_script(
            _DROP_HELD, [self.keys.held(conversation), self.keys.conversation(conversation)], [count]
        )

    async def clear_held(self, conversation: str) -> int:
        """Drop every held command (/stop); returns how many there were."""
        key = self.keys.held(conversation)
        count, _, _ = await self.redis.transaction(
            [("LLEN", key), ("DEL", key), ("HSET", self.keys.conversation(conversation), "held", 0)]
        )
        return int(count)


def inflight_entry(stream: InflightStream) -> str:
    """A stream's in-flight entry: its routing (the cursor is read from the conversation)."""
    return json.dumps({"conversation_key": stream.conversation_key, "trace_id": stream.trace_id})


def _turn_start(raw: Any) -> TurnStart:
    decision, session_id, cursor, interrupt, *rest = (text(v) or "" for v in raw)
    return TurnStart(
        decision=decision,  # type: ignore[arg-type]
        session_id=session_id or None,
        cursor=cursor.partition("|")[2] if cursor.partition("|")[0] == session_id and session_id else None,
        interrupt=interrupt == "1",
        taken=tuple(flag == "1" for flag in rest[0]) if rest and decision == "partial" else (),
        failure=rest[0] if rest and decision == "failed" else None,
    )
