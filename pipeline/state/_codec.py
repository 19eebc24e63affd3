"""How conversation hashes and other values are written as Redis strings and read back."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from .models import ContextEntry, ConversationState, InterruptCause, PendingAction, TurnRecord


def text(value: Any) -> str | None:
    if value is None or value is False:
        return None
    if isinstance(value, bytes):
        return value.decode()
    return str(value)


def hash_fields(fields: dict[str, Any]) -> tuple[dict[Any, Any], list[str]]:
    """Conversation-hash fields as strings; None means delete the field."""
    mapping: dict[Any, Any] = {}
    deletes: list[str] = []
    for name, value in fields.items():
        if value is None:
            deletes.append(name)
        elif name == "interrupted":
            mapping[name] = _STORED_INTERRUPT[value]
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


# A /stop is stored as "1", as workers wrote it before the cause was kept: one of them reading the
# field during a rolling upgrade still sees the /stop (and a `failed` end as none: it answers it).
_STORED_INTERRUPT: dict[InterruptCause, str] = {"stop": "1", "failed": "failed"}
_INTERRUPT_CAUSES: dict[str, InterruptCause] = {stored: cause for cause, stored in _STORED_INTERRUPT.items()}


def conversation_state(raw: dict[Any, Any] | list[Any]) -> ConversationState:
    """A conversation hash (a dict, or HGETALL's flat list inside a script's reply) as its state."""
    if isinstance(raw, list):
        raw = dict(zip(raw[0::2], raw[1::2], strict=True))
    if not raw:
        return ConversationState()
    data = {text(k): text(v) for k, v in raw.items()}
    return ConversationState(
        status=data.get("status") or "idle",
        session_id=data.get("session_id"),
        turn=TurnRecord.model_validate_json(data["turn"] or "") if data.get("turn") else None,
        last_message=data.get("last_message"),
        last_message_id=data.get("last_message_id"),
        pending=[PendingAction.model_validate(p) for p in json.loads(data.get("pending") or "[]")],
        tools={k: PendingAction.model_validate(v) for k, v in json.loads(data.get("tools") or "{}").items()},
        interrupted=_INTERRUPT_CAUSES.get(data.get("interrupted") or ""),
        held=int(data.get("held") or 0),
        cursor=cursor_for(data.get("cursor"), data.get("session_id")),
    )


def cursor_for(stored: str | None, session_id: str | None) -> str | None:
    """The stream cursor kept as `<session id>|<event id>`: only the current session's counts."""
    if not stored or not session_id:
        return None
    owner, _, cursor = stored.partition("|")
    return cursor if owner == session_id else None


def window(raw: list[Any]) -> list[ContextEntry]:
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
