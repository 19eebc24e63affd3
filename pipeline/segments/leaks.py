"""The outbound leak check (S14): secrets must not leave, in any string of any segment, in any form.

Two kinds of match:

- Configured secrets (every credential of every bot and every service credential of the deployment)
  are looked for in *normalised* text: NFKC, zero-width and other format characters removed, Unicode
  lower-cased, the characters markdown uses for emphasis, code, escapes and spoilers (`_MARKERS`)
  removed, percent-escapes decoded. The secret is normalised the same way, so a fullwidth, lowercase,
  `%`-encoded, emphasised or zero-width-split copy is still the secret. The strings of one outbound
  message are read as ONE text (joined without separators, in segment order), so a secret split
  across segments is found too.
  Secrets of fewer than `MIN_CONFIGURED_SECRET_LENGTH` normalised characters are matched only as whole
  tokens (not preceded or followed by a letter or digit), so a short one does not redact parts of
  ordinary words; `LeakScanner.short_secrets` names them for the start-up warning.
- Credential shapes (API keys, tokens, private keys …) of services nobody configured here are matched
  per string, on the text as written.

Every normalised character remembers the span of original characters it came from, so a hit maps back
to exact positions in the original strings, including a hit split across strings: each piece is
replaced by the marker. The mapping is built only after the fast check (normalise the joined text,
substring tests) found something, so a clean message costs a normalisation pass and the tests.

A hit that exists only in what a platform *shows* for markdown (link syntax hides the URL:
`xoxb-12[34](https://x)56` shows `xoxb-123456`) has no position in the source that could be cut
cleanly: `SegmentLeakScan.unmappable` is set and callers block the whole message.

Hits are counted; the secret itself is never logged, returned or put in an exception.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import unquote

from pydantic import BaseModel

from pipeline.segments.models import MEDIA_SEGMENT_TYPES, Segment, TextData, TextSegment

REDACTION_MARKER = "[redacted]"

# Configured values shorter than this (after normalisation) are matched only as whole tokens.
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


def _has_trigger(lowered: str) -> bool:
    for trigger in _ALL_TRIGGERS:  # a plain loop: `any(<generator>)` costs more than the tests
        if trigger in lowered:
            return True
    return False


# --- normalisation --------------------------------------------------------------------------------

# Markdown emphasis/code markers, escapes and spoiler bars: removed, so `xo**xb**-1` reads `xoxb-1`.
_MARKERS = "*_~`\\|"
# Unicode category Cf (format: zero-width space/joiners, bidi controls, soft hyphen, tags, …), as
# ranges so one compiled class finds them (`tests/segments/test_leaks.py` checks them against
# `unicodedata`), and invisible characters outside Cf: the combining grapheme joiner, Hangul fillers,
# Mongolian and Unicode variation selectors.
_FORMAT_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x0600, 0x0605), (0x061C, 0x061C), (0x06DD, 0x06DD), (0x070F, 0x070F),
    (0x0890, 0x0891), (0x08E2, 0x08E2), (0x180E, 0x180E), (0x200B, 0x200F), (0x202A, 0x202E),
    (0x2060, 0x2064), (0x2066, 0x206F), (0xFEFF, 0xFEFF), (0xFFF9, 0xFFFB), (0x110BD, 0x110BD),
    (0x110CD, 0x110CD), (0x13430, 0x13438), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
)  # fmt: skip
_INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x034F, 0x034F), (0x115F, 0x1160), (0x3164, 0x3164), (0xFFA0, 0xFFA0), (0x180B, 0x180D),
    (0x180F, 0x180F), (0xFE00, 0xFE0F), (0xE0100, 0xE01EF),
)  # fmt: skip


def _char_class(ranges: Iterable[tuple[int, int]], extra: str = "") -> str:
    return "[" + "".join(f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges) + re.escape(extra) + "]"


_DROPPED = (*_FORMAT_RANGES, *_INVISIBLE_RANGES)
_DROP = re.compile(_char_class(_DROPPED, _MARKERS) + "+")
# The same test in a form `re` runs fast (a bitmap for the BMP; one range for all astral characters):
# most text has nothing to drop, and this finds that out at a fraction of `_DROP`'s cost.
_MAYBE_DROP = re.compile(_char_class([r for r in _DROPPED if r[1] < 0x10000], _MARKERS) + "|[\U00010000-\U0010ffff]")
_ASCII_MARKER = re.compile(f"[{re.escape(_MARKERS)}]+")
_PERCENT_RUN = re.compile(r"(?:%[0-9a-f]{2})+")


def _fold(text: str) -> str:
    """NFKC, lower case, format/invisible characters and markers dropped (ASCII: the same, faster).

    `lower()`, not `casefold()`: both sides of the comparison go through it, so it only has to
    make a case-changed copy equal (`casefold` would also equate `ß` and `ss`, at twice the cost)."""
    if text.isascii():
        lowered = text.lower()
        return _ASCII_MARKER.sub("", lowered) if _ASCII_MARKER.search(lowered) else lowered
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    text = text.lower()
    return _DROP.sub("", text) if _MAYBE_DROP.search(text) else text


@functools.lru_cache(maxsize=65536)
def _fold_char(char: str) -> str:
    return _fold(char)


def _decode_run(match: re.Match[str]) -> str:
    return _fold(unquote(match.group()))


def normalise(text: str) -> str:
    """The form configured secrets are compared in (see the module docstring)."""
    folded = _fold(text)
    if "%" in folded:
        return _PERCENT_RUN.sub(_decode_run, folded)
    return folded


def _normalise_mapped(text: str) -> tuple[str, list[int], list[int]]:
    """`text` normalised character by character, with, for each resulting character, the span
    [start, end) of `text` it came from. It equals `normalise(text)` except where NFKC composes
    across characters (a base letter and a combining mark): there the fast check may see a secret
    this mapping does not, and the caller blocks instead of cutting."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for index, char in enumerate(text):
        for out in _fold_char(char):
            chars.append(out)
            starts.append(index)
            ends.append(index + 1)
    folded = "".join(chars)
    if "%" not in folded:
        return folded, starts, ends
    pieces: list[str] = []
    new_starts: list[int] = []
    new_ends: list[int] = []
    position = 0
    for match in _PERCENT_RUN.finditer(folded):
        pieces.append(folded[position : match.start()])
        new_starts.extend(starts[position : match.start()])
        new_ends.extend(ends[position : match.start()])
        decoded = _decode_run(match)
        # A decoded run maps to the whole encoded run: a hit in it cuts all of it.
        pieces.append(decoded)
        new_starts.extend([starts[match.start()]] * len(decoded))
        new_ends.extend([ends[match.end() - 1]] * len(decoded))
        position = match.end()
    pieces.append(folded[position:])
    new_starts.extend(starts[position:])
    new_ends.extend(ends[position:])
    return "".join(pieces), new_starts, new_ends


# --- the scanner ----------------------------------------------------------------------------------


class LeakAction(StrEnum):
    REDACT = "redact"
    BLOCK = "block"


@dataclass(frozen=True, slots=True)
class Secret:
    """A configured secret and where it is configured (e.g. `bot onebot/qq1, credential 'secret'`).

    `source` is what warnings name; the value never appears in `repr`, logs or messages.
    """

    value: str = field(repr=False)
    source: str = "a configured secret"


@dataclass(frozen=True, slots=True)
class LeakScan:
    """Result of scanning one string: the safe text and how many secrets were found."""

    text: str
    hits: int


@dataclass(frozen=True, slots=True)
class TextsScan:
    """Result of scanning several strings read as one: the safe strings (same order) and the hits."""

    texts: list[str]
    hits: int
    changed: frozenset[int]  # indexes of the strings that were cut
    unmappable: bool = False  # a secret was seen but could not be placed: block, do not send


def _merge(spans: list[tuple[int, int]], *, touching: bool = True) -> list[tuple[int, int]]:
    """Overlapping spans (and, with `touching`, adjacent ones) merged, in order."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and (start <= merged[-1][1] if touching else start < merged[-1][1]):
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _cut(texts: Sequence[str], spans: list[tuple[int, int]]) -> tuple[list[str], set[int]]:
    """Replace each piece of `spans` (positions in the joined text) by the marker, per string."""
    out: list[str] = []
    changed: set[int] = set()
    offset = 0
    spans = _merge(spans)
    for index, text in enumerate(texts):
        end_of_text = offset + len(text)
        pieces: list[str] = []
        position = 0
        for start, end in spans:
            if end <= offset or start >= end_of_text:
                continue
            local_start, local_end = max(start, offset) - offset, min(end, end_of_text) - offset
            pieces.append(text[position:local_start])
            pieces.append(REDACTION_MARKER)
            position = local_end
        if pieces:
            pieces.append(text[position:])
            out.append("".join(pieces))
            changed.add(index)
        else:
            out.append(text)
        offset = end_of_text
    return out, changed


class LeakScanner:
    """Scans strings for configured secrets (normalised, across strings) and credential shapes.

    Build once per deployment, with every secret of every bot and service: any bot's output can carry
    any of them (a prompt-injected agent is not limited to its own bot's credentials).
    """

    __slots__ = ("_long", "_short_pattern", "short_secrets")

    def __init__(self, secrets: Iterable[str | Secret] = ()) -> None:
        long: dict[str, None] = {}
        short: dict[str, None] = {}
        short_sources: dict[str, None] = {}
        for item in secrets:
            secret = item if isinstance(item, Secret) else Secret(item)
            if not secret.value:
                continue
            normalised = normalise(secret.value)
            if len(normalised) >= MIN_CONFIGURED_SECRET_LENGTH:
                long[normalised] = None
            elif normalised:
                short[normalised] = None
                short_sources[secret.source] = None
            else:  # nothing left after normalisation (only markers or invisible characters)
                short_sources[secret.source] = None
        self._long: tuple[str, ...] = tuple(long)
        alternatives = "|".join(re.escape(s) for s in sorted(short, key=len, reverse=True))
        self._short_pattern = re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)") if alternatives else None
        # Where the secrets matched only as whole tokens are configured (for the start-up warning).
        self.short_secrets: tuple[str, ...] = tuple(short_sources)

    def __repr__(self) -> str:
        return f"LeakScanner({len(self._long)} secrets, {len(self.short_secrets)} short)"

    def _found_in(self, normalised: str) -> bool:
        for secret in self._long:  # a plain loop: `any(<generator>)` costs more than the tests
            if secret in normalised:
                return True
        return self._short_pattern is not None and self._short_pattern.search(normalised) is not None

    def has_configured(self, text: str) -> bool:
        """Whether `text` holds a configured secret (normalised), without saying where."""
        return bool(text) and self._found_in(normalise(text))

    def _configured_spans(self, joined: str) -> tuple[list[tuple[int, int]], int]:
        """Spans of `joined` holding configured secrets, and how many secrets were found. A hit the
        fast check saw but the mapping cannot place comes back as no span and one hit."""
        if not joined or not self._found_in(normalise(joined)):
            return [], 0
        normalised, starts, ends = _normalise_mapped(joined)
        found: list[tuple[int, int]] = []  # spans in the normalised text
        for secret in self._long:
            at = normalised.find(secret)
            while at != -1:
                found.append((at, at + len(secret)))
                at = normalised.find(secret, at + 1)
        if self._short_pattern is not None:
            found.extend(match.span() for match in self._short_pattern.finditer(normalised))
        # Overlapping matches (one secret inside another, or two overlapping) are one hit, cut whole.
        clusters = _merge(found, touching=False)
        if not clusters:
            return [], 1
        return [(starts[start], ends[end - 1]) for start, end in clusters], len(clusters)

    def scan_texts(self, texts: Sequence[str]) -> TextsScan:
        """Scan strings that are shown together (one message): configured secrets across them,
        credential shapes within each. Strings without a hit are returned unchanged (same object)."""
        joined = "".join(texts)
        if not joined:
            return TextsScan(list(texts), 0, frozenset())
        spans, hits = self._configured_spans(joined)
        unmappable = hits > 0 and not spans
        out, changed = _cut(texts, spans) if spans else (list(texts), set())
        if _has_trigger(("".join(out) if spans else joined).lower()):
            for index, text in enumerate(out):
                text_lowered = text.lower()
                for pattern, triggers in _COMPILED_SHAPES:
                    if any(trigger in text_lowered for trigger in triggers):
                        text, shape_hits = pattern.subn(REDACTION_MARKER, text)
                        if shape_hits:
                            hits += shape_hits
                            changed.add(index)
                            text_lowered = text.lower()
                out[index] = text
        return TextsScan(out, hits, frozenset(changed), unmappable)

    def scan(self, text: str) -> LeakScan:
        """Scan one string; a hit that cannot be placed takes the whole string."""
        result = self.scan_texts([text])
        return LeakScan(REDACTION_MARKER if result.unmappable else result.texts[0], result.hits)


DEFAULT_SCANNER = LeakScanner()


# --- segments -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SegmentLeakScan:
    """The segments after redaction, total hits, which positions hit, and whether a hit could not be
    mapped to positions (callers then block the message).

    A text or markdown segment that hit keeps its place with the secret cut out; any other segment
    that hit (media, share, mention, reply, forward, face) is replaced by a text segment holding the
    marker, so no reference that carried a secret is ever followed or shown.
    """

    segments: list[Segment]
    hits: int
    hit_positions: frozenset[int]
    unmappable: bool = False


# Where a string sits: (segment position, path of field names inside the segment).
_Place = tuple[int, tuple[str, ...]]


@functools.cache
def _field_names(model_class: type[BaseModel]) -> tuple[str, ...]:
    return tuple(model_class.model_fields)  # pydantic's accessor is slow on the hot path; cached


def _strings(model: BaseModel, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], str]]:
    # Every field, so nested strings (media.value, share.url/title, …) are covered, including fields
    # added to the models later.
    for name in _field_names(type(model)):
        if name == "type" and not path:
            continue  # the segment's discriminator: ours, not the agent's text
        value = getattr(model, name)
        if isinstance(value, str):
            yield (*path, name), value
        elif isinstance(value, BaseModel):
            yield from _strings(value, (*path, name))


def _skip_base64(segment: Segment) -> bool:
    # Inline base64 is binary data, not text: a pattern hit inside it is noise, and the bytes go
    # through the media check instead.
    if segment.type not in MEDIA_SEGMENT_TYPES:
        return False
    return bool(segment.data.media.kind == "base64")  # type: ignore[union-attr]


def _replace(model: BaseModel, path: tuple[str, ...], value: str) -> BaseModel:
    if len(path) == 1:
        return model.model_copy(update={path[0]: value})
    inner = getattr(model, path[0])
    return model.model_copy(update={path[0]: _replace(inner, path[1:], value)})


_MARKDOWN_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def _shown(place: _Place, text: str, segments: Sequence[Segment]) -> str:
    # What a platform shows for a markdown string: link syntax collapsed to the link text.
    if segments[place[0]].type == "markdown" and "](" in text:
        return _MARKDOWN_LINK.sub(r"\1", text)
    return text


def scan_segments(segments: list[Segment], scanner: LeakScanner) -> SegmentLeakScan:
    """Scan every string of every segment, read as one text; returns redacted copies of what hit."""
    places: list[_Place] = []
    texts: list[str] = []
    for index, segment in enumerate(segments):
        if _skip_base64(segment):
            continue
        for path, value in _strings(segment, ()):
            places.append((index, path))
            texts.append(value)
    result = scanner.scan_texts(texts)
    out = list(segments)
    positions: set[int] = set()
    for text_index in sorted(result.changed):
        index, path = places[text_index]
        positions.add(index)
        segment = out[index]
        if segment.type in ("text", "markdown"):
            out[index] = _replace(segment, path, result.texts[text_index])  # type: ignore[call-overload]
        else:
            out[index] = TextSegment(type="text", data=TextData(text=REDACTION_MARKER))
    hits, unmappable = result.hits, result.unmappable
    if not unmappable and any(segments[place[0]].type == "markdown" for place in places):
        shown = [_shown(place, text, segments) for place, text in zip(places, result.texts, strict=True)]
        if shown != result.texts and scanner.has_configured("".join(shown)):
            hits, unmappable = hits + 1, True
    return SegmentLeakScan(out, hits, frozenset(positions), unmappable)
