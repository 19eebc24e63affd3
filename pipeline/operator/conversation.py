"""`switchboard conversation`: what support needs when a user says "the bot never answered": the
conversation's session, the turn in flight, the messages held behind it, the session stream's
cursor, and the last replies egress was given, each with whether it was delivered.

Read from what the stages already keep (Redis: the conversation's hash, its turns, its held list,
the streams in flight, egress's delivered markers; Kafka: the conversation's partition of its
platform's outbound topic, read back from the end without a consumer group). Nothing is written.
A session id is found back to its conversation through the streams in flight, else by scanning the
conversation → session mappings (an operator's rare question does not justify a reverse index
every turn would have to write). Message texts only with `bodies`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from pydantic import ValidationError

from pipeline.platforms import Platform
from pipeline.records import OutboundMessage, join_ids, parse_conversation_key
from pipeline.state import ConversationState, RedisPy, State, TurnRecord

from .letters import iso

#: How many of the conversation's last outbound messages are shown.
LAST_REPLIES = 3


@dataclass(frozen=True)
class OutboundSeen:
    """One outbound message of the conversation as its topic holds it."""

    partition: int
    offset: int
    timestamp_ms: int
    message: OutboundMessage
    # True/False: egress's marker says delivered or not (yet); None: the platform keeps no markers.
    delivered: bool | None


def session_partition(conversation: str, partitions: int) -> int:
    """The partition of `session.input` (and `im.inbound`, `session.events`) the conversation is on."""
    every = list(range(partitions))
    return int(DefaultPartitioner()(conversation.encode(), every, every))


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


async def conversation_of_session(state: State, redis: RedisPy, partitions: int, session_id: str) -> str | None:
    """The conversation whose session is `session_id`: a stream in flight names it; else the
    conversation → session mappings are scanned (SCAN, in batches: no blocking the server)."""
    for partition in range(partitions):
        for stream in await state.streams.inflight(partition):
            if stream.session_id == session_id and stream.conversation_key:
                return stream.conversation_key
    mapping_prefix = state.keys.of("c2s", "")
    async for raw_key in redis.scan_iter(match=_glob_escape(mapping_prefix) + "*", count=1000):
        key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
        value = await redis.get(key)
        if value is not None and (value.decode() if isinstance(value, bytes) else str(value)) == session_id:
            conversation = key[len(mapping_prefix) :]
            if state.keys.cluster and conversation.startswith("{") and conversation.endswith("}"):
                conversation = _untag(conversation[1:-1])
            return conversation
    return None


def _untag(scope: str) -> str:
    return scope.replace("%7B", "{").replace("%7D", "}").replace("%25", "%")


async def read_state(state: State, conversation: str, partitions: int) -> dict[str, Any]:
    """Everything Redis keeps of the conversation, as `describe` takes it."""
    conversations = state.conversations
    turn_ids = await conversations.turns_in_session(conversation)
    turns = {turn_id: await conversations.turn(turn_id, conversation) for turn_id in turn_ids}
    partition = session_partition(conversation, partitions)
    streams = [s for s in await state.streams.inflight(partition) if s.conversation_key == conversation]
    return {
        "mapped_session": await conversations.session_for(conversation),
        "state": await conversations.conversation(conversation),
        "turns": turns,
        "held": await conversations.peek_held(conversation),
        "partition": partition,
        "streaming": [s.session_id for s in streams],
    }


async def delivered_flags(
    state: State, platform: Platform | None, messages: list[OutboundMessage]
) -> list[bool | None]:
    """Per message, egress's delivered marker: set, not set, or None where the platform keeps none."""
    if platform is None or platform.profile.delivers_once or not messages:
        return [None] * len(messages)
    keys = [state.keys.marker("out", m.outbound_id, join_ids(m.platform, m.bot_id)) for m in messages]
    values = await state.redis.pipeline([("EXISTS", key) for key in keys])
    return [bool(int(v)) for v in values]


def parse_outbound(value: bytes | None) -> OutboundMessage | None:
    try:
        return OutboundMessage.model_validate_json(value or b"")
    except ValidationError:
        return None


def describe(
    conversation: str,
    stored: dict[str, Any],
    outbound: list[OutboundSeen],
    *,
    bodies: bool = False,
) -> dict[str, Any]:
    """The report: pure, from what `read_state` and the outbound topic gave."""
    state: ConversationState = stored["state"]
    turns: dict[str, TurnRecord | None] = stored["turns"]
    ref = parse_conversation_key(conversation)
    report: dict[str, Any] = {
        "conversation": conversation,
        "platform": ref.platform,
        "bot": ref.bot_id,
        "chat": ref.chat_id,
        "user": ref.user_id,
        "session": stored["mapped_session"],
        "status": state.status,
        "partition": stored["partition"],
        "turns_in_flight": [_turn(turn_id, record) for turn_id, record in turns.items()],
        "stream": {
            "held_by_a_worker": bool(stored["streaming"]),
            "cursor": state.cursor,
        },
        "held": [_held(turn_id, command, bodies) for turn_id, command in stored["held"]],
        "held_count": state.held,
        "waiting_on_chat": [{"kind": p.kind, "tool": p.name, "event_id": p.event_id} for p in state.pending],
        "interrupted": state.interrupted,
        "last_message_id": state.last_message_id,
        "last_replies": [_outbound(o, bodies) for o in outbound],
    }
    if bodies:
        report["last_message"] = state.last_message
    # Nothing kept: never seen, or its state expired (SWITCHBOARD_MAPPING_TTL_SECONDS after the last turn).
    report["known"] = bool(
        stored["mapped_session"] or turns or stored["held"] or state != ConversationState() or outbound
    )
    delivered = [o for o in outbound if o.delivered]
    report["last_delivered"] = _outbound(delivered[-1], bodies) if delivered else None
    return report


def _turn(turn_id: str, record: TurnRecord | None) -> dict[str, Any]:
    if record is None:
        return {"turn_id": turn_id, "record": "expired"}
    started = record.hops.get("dispatch") or record.hops.get("ingress")
    return {
        "turn_id": turn_id,
        "trace_id": record.trace_id,
        "started": iso(started) if started else None,
        "inbound_ids": record.inbound_ids,
        "reply_to_message_id": record.reply_to_message_id,
    }


def _held(turn_id: str, command: str, bodies: bool) -> dict[str, Any]:
    held: dict[str, Any] = {"turn_id": turn_id}
    try:
        data = json.loads(command)
    except ValueError:
        return held | {"parses": False}
    if isinstance(data, dict):
        held |= {"kind": data.get("kind"), "inbound_ids": data.get("inbound_ids"), "trace_id": data.get("trace_id")}
        if bodies:
            held["events"] = data.get("events")
    return held


def _outbound(seen: OutboundSeen, bodies: bool) -> dict[str, Any]:
    message = seen.message
    row: dict[str, Any] = {
        "outbound_id": message.outbound_id,
        "kind": message.kind,
        "at": iso(seen.timestamp_ms),
        "position": f"{seen.partition}:{seen.offset}",
        "delivered": "no markers (the platform de-duplicates)" if seen.delivered is None else seen.delivered,
        "segments": [s.type for s in message.segments],
    }
    if "replay" in message.hops:
        row["replayed"] = iso(message.hops["replay"])
    if bodies:
        row["segments_full"] = [s.model_dump(mode="json") for s in message.segments]
    return row


def render_text(report: dict[str, Any]) -> list[str]:
    """The report for a terminal: one fact a line."""
    if not report["known"]:
        return [
            f"conversation  {report['conversation']}: nothing kept (never seen here, or its state expired",
            "  SWITCHBOARD_MAPPING_TTL_SECONDS after its last turn); check the platform, bot and chat ids",
        ]
    lines = [
        f"conversation  {report['conversation']}",
        f"  platform {report['platform']}, bot {report['bot']}, chat {report['chat']}"
        + (f", user {report['user']}" if report["user"] else ""),
        f"  session     {report['session'] or '(none mapped: the next message starts one)'}",
        f"  status      {report['status']}"
        + (f" (interrupted: {report['interrupted']})" if report["interrupted"] else ""),
        f"  partition   {report['partition']} of session.input",
    ]
    turns = report["turns_in_flight"]
    lines.append(f"  turns       {len(turns)} in flight" if turns else "  turns       none in flight")
    for turn in turns:
        if turn.get("record") == "expired":
            lines.append(f"    {turn['turn_id']}: its record expired")
            continue
        lines.append(
            f"    {turn['turn_id']}: started {turn['started'] or '?'}, trace {turn['trace_id']}, "
            f"messages {', '.join(turn['inbound_ids']) or '-'}"
        )
    stream = report["stream"]
    held_by = "held by a worker" if stream["held_by_a_worker"] else "not held"
    lines.append(f"  stream      {held_by}, cursor {stream['cursor'] or '-'}")
    lines.append(f"  held        {report['held_count']} message(s) behind the turn")
    for held in report["held"]:
        lines.append(f"    {held['turn_id']}: {held.get('kind')}, messages {held.get('inbound_ids')}")
    for waiting in report["waiting_on_chat"]:
        lines.append(f"  waiting     on the chat: {waiting['kind']} {waiting['tool']} ({waiting['event_id']})")
    if "last_message" in report:
        lines.append(f"  last text   {report['last_message']!r}")
    last = report["last_delivered"]
    lines.append(
        f"  delivered   last {last['kind']} {last['outbound_id']} at {last['at']}"
        if last
        else "  delivered   none found"
    )
    for reply in report["last_replies"]:
        lines.append(
            f"    {reply['at']} {reply['kind']} {reply['outbound_id']} ({', '.join(reply['segments'])}): "
            f"delivered {reply['delivered']}" + (f", replayed {reply['replayed']}" if "replayed" in reply else "")
        )
    return lines
