"""User turns made of several inbound messages: merged by ingest (a chat's triggers of one batch)
and by dispatch (messages held while the session was busy), and cut down again by dispatch when a
replayed turn carries messages another turn already took.

A merged turn records how many content blocks each of its messages contributed (`parts`, aligned
with `inbound_ids`), so that a message can be taken out of it again; one message's turn leaves
`parts` empty (all its blocks are that message's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipeline.records import SessionCommand

from ._ids import user_message_id


def user_content(command: SessionCommand) -> list[Any]:
    """The content blocks of the command's user.message events, in order."""
    content: list[Any] = []
    for event in command.events:
        if event.get("type") == "user.message":
            content.extend(event.get("content", []))
    return content


def message_parts(command: SessionCommand, content: Sequence[Any] | None = None) -> list[int] | None:
    """How many content blocks each inbound message contributed, aligned with `inbound_ids`; None
    when the record does not say (an older merged record)."""
    blocks = len(user_content(command) if content is None else content)
    if not command.parts and len(command.inbound_ids) == 1:
        return [blocks]
    if len(command.parts) == len(command.inbound_ids) and sum(command.parts) == blocks:
        return list(command.parts)
    return None


def merge_turns(commands: Sequence[SessionCommand]) -> SessionCommand:
    """Coalesce user turns of one conversation into one: content blocks in order, one stable id
    over all inputs, each message's share of the blocks (`parts`) kept.

    The newest command's system text wins (its context window is the most recent), and so do its
    sender and the message replied to; mentionable ids are the union; hop times are the first's
    (latency counts from the first message).
    """
    if len(commands) == 1:
        return commands[0]
    inbound_ids = [i for c in commands for i in c.inbound_ids]
    content: list[Any] = []
    parts: list[int] | None = []
    for command in commands:
        blocks = user_content(command)
        content.extend(blocks)
        shares = message_parts(command, blocks)
        if shares is None:  # an older merged record: the merge cannot say whose blocks are whose
            parts = None
        elif parts is not None:
            parts.extend(shares)
    last = commands[-1]
    known: list[str] = []
    seen: set[str] = set()
    for command in commands:
        for ident in command.known_ids:
            if ident not in seen:
                seen.add(ident)
                known.append(ident)
    hops = dict(commands[0].hops)
    return last.model_copy(
        update={
            "events": [
                {"type": "user.message", "id": user_message_id(last.conversation_key, inbound_ids), "content": content}
            ],
            "inbound_ids": inbound_ids,
            "parts": parts or [],
            "known_ids": known,
            "hops": hops,
        }
    )


def without_messages(command: SessionCommand, taken: Sequence[bool]) -> SessionCommand | None:
    """The turn without the inbound messages flagged in `taken` (aligned with `inbound_ids`): their
    content blocks and ids left out, the stable id derived from the rest. None when the record does
    not say which blocks are whose, or nothing would remain."""
    content = user_content(command)
    parts = message_parts(command, content)
    if parts is None or len(taken) != len(parts) or all(taken):
        return None
    ids: list[str] = []
    kept_parts: list[int] = []
    kept: list[Any] = []
    at = 0
    for ident, count, gone in zip(command.inbound_ids, parts, taken, strict=True):
        if not gone:
            ids.append(ident)
            kept_parts.append(count)
            kept.extend(content[at : at + count])
        at += count
    update: dict[str, Any] = {
        "events": [{"type": "user.message", "id": user_message_id(command.conversation_key, ids), "content": kept}],
        "inbound_ids": ids,
        "parts": kept_parts if len(ids) > 1 else [],
    }
    if command.reply_to_message_id is not None and command.reply_to_message_id not in ids:
        # The answer quotes the newest message it answers.
        update["reply_to_message_id"] = ids[-1]
    return command.model_copy(update=update)
