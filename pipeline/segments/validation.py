"""Strict validation of the reply text (S8, S10).

The text must be exactly one JSON object matching `Reply`: no code-fence stripping, no extraction
from prose, no coercion, no partial acceptance. Validation is pydantic-core's JSON parser plus the
strict models, built once at import, so a typical reply costs tens of microseconds.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from pipeline.segments.exceptions import ReplyInvalid, SegmentsError
from pipeline.segments.models import SEGMENT_TYPES, Reply, reply_adapter

# Names that may appear in a reason: field names of the contract and the segment tags. Anything else
# in an error location comes from the reply itself (an unknown key) and is replaced by `?`.
_KNOWN_LOCATION_NAMES: frozenset[str] = frozenset(
    {
        "segments",
        "type",
        "data",
        "text",
        "content",
        "target",
        "media",
        "kind",
        "value",
        "message_id",
        "forward_id",
        "id",
        "url",
        "title",
        "str",
        "int",
        "float",
        *SEGMENT_TYPES,
    }
)
_MAX_REASON_PARTS = 8


def _location_text(location: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for part in location[:_MAX_REASON_PARTS]:
        if isinstance(part, int):
            parts.append(str(part))
        elif part in _KNOWN_LOCATION_NAMES:
            parts.append(part)
        else:
            parts.append("?")
    return ".".join(parts) or "root"


def invalid_reason(error: ValidationError) -> str:
    """A short, content-free reason for a validation failure: the first error's kind and location."""
    errors = error.errors(include_url=False, include_input=False, include_context=False)
    if not errors:
        return "schema"
    first = errors[0]
    kind = str(first.get("type", "error"))
    if kind == "json_invalid":
        return "invalid_json"
    if kind == "model_type" and not first.get("loc"):
        return "not_an_object"
    return f"schema:{_location_text(tuple(first.get('loc', ())))}:{kind}"


class _DuplicateKey(SegmentsError, ValueError):
    """A JSON object with a key twice (control flow inside `_has_duplicate_keys`)."""


def _pairs_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _DuplicateKey
    return obj


def _has_duplicate_keys(text: str) -> bool:
    # pydantic-core keeps the last of duplicated keys, silently dropping the others: that would be
    # partial acceptance (S8). The stdlib parser with a pairs hook sees every key.
    try:
        json.loads(text, object_pairs_hook=_pairs_without_duplicates)
    except _DuplicateKey:
        return True
    except ValueError:  # e.g. a number the stdlib reads differently; pydantic already accepted the text
        return False
    return False


def validate_reply(text: str) -> Reply:
    """Parse `text` as one strict `{"segments": [...]}` object or raise `ReplyInvalid`."""
    if not isinstance(text, str):
        raise ReplyInvalid("not_text")
    try:
        reply = reply_adapter.validate_json(text, strict=True)
    except ValidationError as error:
        raise ReplyInvalid(invalid_reason(error)) from None
    if _has_duplicate_keys(text):
        raise ReplyInvalid("duplicate_key")
    return reply


def validate_reply_object(obj: Any) -> Reply:
    """Validate an already-parsed object (e.g. a provider's tool-call arguments) with the same rules."""
    try:
        return reply_adapter.validate_python(obj, strict=True)
    except ValidationError as error:
        raise ReplyInvalid(invalid_reason(error)) from None


def reply_to_json(reply: Reply) -> str:
    """Compact JSON of a validated reply (what the schema validates)."""
    return reply.model_dump_json()
