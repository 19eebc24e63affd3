"""The outbound leak check (S14): secrets must not leave, in any string of any segment.

One compiled alternation of credential shapes plus plain substring checks for the configured secret
values (a handful per deployment, so `in` beats building an automaton). Hits are counted and the
matching text replaced by a fixed marker; the secret itself is never logged or returned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from pydantic import BaseModel

from pipeline.segments.models import MEDIA_SEGMENT_TYPES, Segment

REDACTION_MARKER = "[redacted]"

# Configured values shorter than this would redact ordinary words; they are refused at build time.
MIN_CONFIGURED_SECRET_LENGTH = 8

# Credential shapes, each with the lower-cased literals one of which it always contains. Most
# outbound text contains none of the literals; a few substring tests are far cheaper than running a
# regex (Python's `re` loses its literal-prefix fast path on `\b`-anchored alternatives).
_CREDENTIAL_SHAPES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # PEM private key blocks (to the END line, or to the end of the string when it is cut off).
    (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----(?:.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----|.*\Z)",
        ("private key",),
    ),
    # OpenAI (sk-, sk-proj-, sk-svcacct-…) and Anthropic (sk-ant-api03-…) API keys.
    (r"\bsk-[A-Za-z0-9_-]{20,}", ("sk-",)),
    # AWS access key ids; Volcengine access keys (AKLT… long-term, AKTP… temporary).
    (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", ("akia", "asia")),
    (r"\bAK(?:LT|TP)[A-Za-z0-9_-]{20,}", ("aklt", "aktp")),
    # GitHub tokens.
    (r"\bgh[pousr]_[A-Za-z0-9]{30,}", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (r"\bgithub_pat_[A-Za-z0-9_]{22,}", ("github_pat_",)),
    # Slack tokens and incoming-webhook URLs.
    (r"\bxox[abposre]-[A-Za-z0-9-]{10,}", ("xox",)),
    (r"\bxapp-\d-[A-Za-z0-9-]{10,}", ("xapp-",)),
    (r"hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}", ("hooks.slack.com",)),
    # Telegram bot tokens: <bot id>:AA<33 chars>.
    (r"\b\d{6,12}:AA[A-Za-z0-9_-]{33}\b", (":aa",)),
    # Google API keys.
    (r"\bAIza[0-9A-Za-z_-]{35}", ("aiza",)),
    # JWTs (header and payload are base64url JSON objects, so both start with `eyJ`).
    (r"\beyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*", ("eyj",)),
    # Bearer credentials (HTTP Authorization values).
    (r"(?i:\bbearer)\s+[A-Za-z0-9._~+/=-]{16,}", ("bearer",)),
    # Labelled secrets, e.g. `ARK_API_KEY=…` (Ark keys are UUID-shaped, so only the labelled form is
    # recognisable without flagging every UUID; the deployed key itself is a configured value).
    (
        r"(?i:api[_-]?key|secret(?:[_-]?key)?|access[_-]?key|auth[_-]?token|password)"
        r"[\"']?\s*[:=]\s*[\"']?[A-Za-z0-9._~+/=-]{16,}",
        ("key", "secret", "token", "password"),
    ),
)
_COMPILED_SHAPES: tuple[tuple[re.Pattern[str], tuple[str, ...]], ...] = tuple(
    (re.compile(pattern, re.DOTALL), triggers) for pattern, triggers in _CREDENTIAL_SHAPES
)
_ALL_TRIGGERS: tuple[str, ...] = tuple(sorted({t for _, triggers in _CREDENTIAL_SHAPES for t in triggers}))


class LeakAction(StrEnum):
    REDACT = "redact"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class LeakScan:
    """Result of scanning one string: the safe text and how many secrets were found."""

    text: str
    hits: int


class LeakScanner:
    """Scans strings for configured secret values and common credential shapes. Build once per bot."""

    __slots__ = ("_secrets",)

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = {value for value in secrets if value}
        short = [value for value in values if len(value) < MIN_CONFIGURED_SECRET_LENGTH]
        if short:
            raise ValueError(f"{len(short)} configured secret(s) shorter than {MIN_CONFIGURED_SECRET_LENGTH}")
        # Longest first so a secret containing another is replaced whole.
        self._secrets: tuple[str, ...] = tuple(sorted(values, key=len, reverse=True))

    def scan(self, text: str) -> LeakScan:
        hits = 0
        for secret in self._secrets:
            if secret in text:
                hits += text.count(secret)
                text = text.replace(secret, REDACTION_MARKER)
        lowered = text.lower()
        if any(trigger in lowered for trigger in _ALL_TRIGGERS):
            for pattern, triggers in _COMPILED_SHAPES:
                if any(trigger in lowered for trigger in triggers):
                    text, shape_hits = pattern.subn(REDACTION_MARKER, text)
                    hits += shape_hits
        return LeakScan(text, hits)


DEFAULT_SCANNER = LeakScanner()


@dataclass(frozen=True, slots=True)
class SegmentLeakScan:
    """The segments after redaction, total hits, and which positions hit (media there must be dropped)."""

    segments: list[Segment]
    hits: int
    hit_positions: frozenset[int]


def _scan_model(model: BaseModel, scanner: LeakScanner) -> tuple[BaseModel, int]:
    # Walk every field so nested strings (media.value, share.url/title, …) are covered, including
    # fields added to the models later. Untouched models are returned as-is (no copy on the hot path).
    updates: dict[str, object] = {}
    hits = 0
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, str):
            result = scanner.scan(value)
            if result.hits:
                hits += result.hits
                updates[name] = result.text
        elif isinstance(value, BaseModel):
            new_value, sub_hits = _scan_model(value, scanner)
            if sub_hits:
                hits += sub_hits
                updates[name] = new_value
    if not updates:
        return model, 0
    return model.model_copy(update=updates), hits


def _skip_base64(segment: Segment) -> bool:
    # Inline base64 is binary data, not text: a pattern hit inside it is noise, and the bytes go
    # through the media check instead.
    if segment.type not in MEDIA_SEGMENT_TYPES:
        return False
    return bool(segment.data.media.kind == "base64")  # type: ignore[union-attr]


def scan_segments(segments: list[Segment], scanner: LeakScanner) -> SegmentLeakScan:
    """Scan every string of every segment; returns redacted copies of the segments that hit."""
    out: list[Segment] = []
    hits = 0
    positions: set[int] = set()
    for index, segment in enumerate(segments):
        if _skip_base64(segment):
            out.append(segment)
            continue
        new_segment, segment_hits = _scan_model(segment, scanner)
        if segment_hits:
            hits += segment_hits
            positions.add(index)
        out.append(new_segment)  # type: ignore[arg-type]
    return SegmentLeakScan(out, hits, frozenset(positions))
