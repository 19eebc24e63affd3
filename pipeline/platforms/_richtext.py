"""A small rich-text model shared by the platform renderers.

Outbound text, markdown and mentions are first turned into `RichText` (plain text plus nested
spans), then each platform writes it in its own terms: Telegram entities (UTF-16 offsets), Slack
mrkdwn, plain text for OneBot. Splitting at a platform's length limit happens on `RichText`, so
formatting survives the cut (spans are clipped, never broken into stray markers).

The markdown reader is deliberately small: the subset agents write (fenced and inline code, bold,
italic, strikethrough, links, headings, lists). Anything else stays literal text, which is what a
reader would see in a plain-text client anyway.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

SpanKind = Literal["bold", "italic", "strike", "code", "pre", "link", "mention"]


@dataclass(frozen=True)
class Span:
    start: int  # code-point offsets into RichText.text
    end: int
    kind: SpanKind
    url: str | None = None  # link
    user: str | None = None  # mention: the platform user id
    language: str | None = None  # pre


@dataclass
class RichText:
    text: str = ""
    spans: list[Span] = field(default_factory=list)

    def append(self, text: str, kind: SpanKind | None = None, **attrs: str | None) -> None:
        start = len(self.text)
        self.text += text
        if kind is not None and text:
            self.spans.append(Span(start, len(self.text), kind, **attrs))

    def extend(self, other: RichText) -> None:
        shift = len(self.text)
        self.text += other.text
        self.spans.extend(replace(s, start=s.start + shift, end=s.end + shift) for s in other.spans)

    def is_blank(self) -> bool:
        return not self.text.strip()

    def sorted_spans(self) -> list[Span]:
        # Outer spans before the spans they contain: by start, then longest first.
        return sorted(self.spans, key=lambda s: (s.start, -s.end))


# --- UTF-16 (Telegram counts lengths and offsets in UTF-16 code units) ---------------------------


# ASCII text (`str.isascii()` is a flag CPython keeps: no scan) has one UTF-16 unit per character,
# so its lengths and slices need no encoding; the result is the same as the encoded one's.


def utf16_len(text: str) -> int:
    if text.isascii():
        return len(text)
    return len(text.encode("utf-16-le")) // 2


def utf16_slice(text: str, offset: int, length: int) -> str:
    if text.isascii():
        return text[offset : offset + length]
    data = text.encode("utf-16-le")
    return data[offset * 2 : (offset + length) * 2].decode("utf-16-le", errors="replace")


def utf16_to_index(text: str, units: int) -> int:
    """The code-point index at `units` UTF-16 units (rounded down at a surrogate pair)."""
    count = 0
    for i, ch in enumerate(text):
        step = 2 if ord(ch) > 0xFFFF else 1
        if count + step > units:
            return i
        count += step
    return len(text)


# --- markdown → RichText -------------------------------------------------------------------------

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})\s*([\w+#.-]*)\s*$")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")

# Links: label with one level of nested brackets, URL with one level of balanced parentheses.
# Possessive quantifiers and classes that stop at the next `[` keep a failed match short, so text
# full of unclosed brackets stays linear.
_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*+)\]\(\s*<?((?:[^()\s<>\[\]]|\([^()\s<>\[\]]*\))++)>?"
    r"(?:\s+\"[^\"\n]*\")?\s*\)"
)
_AUTOLINK = re.compile(r"<(https?://[^<>\s]+)>")
_ESCAPABLE = set("\\`*_{}[]()#+-.!~|>")
_EMPHASIS: tuple[tuple[str, SpanKind], ...] = (
    ("**", "bold"),
    ("__", "bold"),
    ("~~", "strike"),
    ("*", "italic"),
    ("_", "italic"),
)


class _Closers:
    """Where each emphasis marker may close, found once per text: each opener then finds its
    closer by bisection instead of a lazy regex scan (which is quadratic on unclosed markers).
    The rules: a closer is not preceded by whitespace; single `*`/`_` are not part of a double
    marker; `_` does not close inside a word."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.positions: dict[str, list[int]] = {}

    def _valid(self, marker: str, p: int) -> bool:
        src = self.src
        before = src[p - 1] if p > 0 else " "
        after = src[p + len(marker)] if p + len(marker) < len(src) else " "
        if before.isspace():
            return False
        if marker == "*":
            return before != "*" and after != "*"
        if marker == "_":
            return before != "_" and not (after.isascii() and after.isalnum())
        return True

    def find(self, marker: str, at_least: int) -> int:
        positions = self.positions.get(marker)
        if positions is None:
            positions = []
            start = self.src.find(marker)
            while start != -1:
                if self._valid(marker, start):
                    positions.append(start)
                start = self.src.find(marker, start + 1)
            self.positions[marker] = positions
        index = bisect.bisect_left(positions, at_least)
        return positions[index] if index < len(positions) else -1


def _opens(src: str, i: int, marker: str) -> bool:
    after = src[i + len(marker)] if i + len(marker) < len(src) else " "
    if after.isspace() or (len(marker) == 1 and after == marker):
        return False
    # `snake_case_names` are not emphasis: an underscore marker must start at a word boundary.
    return not (marker[0] == "_" and i > 0 and src[i - 1].isalnum())


def _backtick_runs(src: str) -> dict[int, list[int]]:
    runs: dict[int, list[int]] = {}
    for m in re.finditer(r"`+", src):
        runs.setdefault(len(m.group()), []).append(m.start())
    return runs


_MAX_NESTING = 16  # deeper emphasis is shown as the text it contains: no unbounded recursion


def parse_inline(src: str, depth: int = 0) -> RichText:
    out = RichText()
    plain: list[str] = []
    closers = _Closers(src)
    runs: dict[int, list[int]] | None = None

    def flush() -> None:
        if plain:
            out.append("".join(plain))
            plain.clear()

    def styled(inner_src: str, kind: SpanKind) -> None:
        flush()
        inner = parse_inline(inner_src, depth + 1) if depth < _MAX_NESTING else RichText(inner_src)
        start = len(out.text)
        out.extend(inner)
        if len(out.text) > start:
            out.spans.append(Span(start, len(out.text), kind))

    i = 0
    while i < len(src):
        ch = src[i]
        if ch == "\\" and i + 1 < len(src) and src[i + 1] in _ESCAPABLE:
            plain.append(src[i + 1])
            i += 2
            continue
        if ch == "`":
            # A code span: a backtick run closed by the next run of the same length.
            n = len(src[i:]) - len(src[i:].lstrip("`"))
            if runs is None:
                runs = _backtick_runs(src)
            same = runs.get(n, [])
            k = bisect.bisect_left(same, i + n + 1)
            if k < len(same):
                flush()
                code = src[i + n : same[k]]
                out.append(code.strip(" ") or code, "code")
                i = same[k] + n
            else:
                plain.append("`" * n)
                i += n
            continue
        if ch in "![" and (m := _LINK.match(src, i)):
            flush()
            label = parse_inline(m.group(1), _MAX_NESTING) if m.group(1) else RichText(m.group(2))
            start = len(out.text)
            out.extend(label)
            out.spans.append(Span(start, len(out.text), "link", url=m.group(2)))
            i = m.end()
            continue
        if ch == "<" and (m := _AUTOLINK.match(src, i)):
            flush()
            out.append(m.group(1), "link", url=m.group(1))
            i = m.end()
            continue
        if ch in "*_~":
            matched = False
            for marker, kind in _EMPHASIS:
                if src.startswith(marker, i) and _opens(src, i, marker):
                    end = closers.find(marker, i + len(marker) + 1)
                    if end != -1:
                        styled(src[i + len(marker) : end], kind)
                        i = end + len(marker)
                        matched = True
                        break
            if matched:
                continue
        plain.append(ch)
        i += 1
    flush()
    return out


def parse_markdown(src: str) -> RichText:
    out = RichText()
    lines = src.replace("\r\n", "\n").split("\n")
    i = 0
    first = True
    while i < len(lines):
        line = lines[i]
        if not first:
            out.append("\n")
        first = False
        fence = _FENCE.match(line)
        if fence:
            marker, language = fence.group(1), fence.group(2) or None
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append(lines[i])
                i += 1
            i += 1  # the closing fence (or the end of an unclosed block)
            code = "\n".join(body)
            if code:
                start = len(out.text)
                out.append(code)
                out.spans.append(Span(start, len(out.text), "pre", language=language))
            continue
        if (m := _HEADING.match(line)) is not None:
            heading = parse_inline(m.group(1))
            start = len(out.text)
            out.extend(heading)
            if heading.text:
                out.spans.append(Span(start, len(out.text), "bold"))
        elif _RULE.match(line):
            out.append("──────────")
        elif (m := _BULLET.match(line)) is not None:
            out.append(m.group(1) + "• ")
            out.extend(parse_inline(m.group(2)))
        else:
            out.extend(parse_inline(line))
        i += 1
    return out


# --- splitting -----------------------------------------------------------------------------------


def split_rich(rich: RichText, limit: int, *, utf16: bool = False) -> list[RichText]:
    """Cut `rich` into pieces of at most `limit` (code points, or UTF-16 units), preferring
    paragraph, line and word boundaries, never inside a mention, clipping spans at the cuts and
    trimming the whitespace at each cut (platforms trim it anyway, which would shift offsets)."""
    measure: Callable[[str], int] = utf16_len if utf16 else len
    pieces: list[RichText] = []
    text = rich.text
    spans = rich.spans
    pos = 0
    while pos < len(text):
        rest = text[pos:]
        if measure(rest) <= limit:
            cut = len(text)
        else:
            hard = pos + (utf16_to_index(rest, limit) if utf16 else limit)
            cut = _best_cut(text, pos, hard, spans)
        piece = _slice(text, spans, pos, cut)
        if not piece.is_blank():
            pieces.append(piece)
        pos = cut
    return pieces


def _best_cut(text: str, lo: int, hard: int, spans: list[Span]) -> int:
    window = text[lo:hard]
    floor = len(window) // 2  # do not make tiny pieces to find a nicer boundary
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > floor:
            cut = lo + at + len(sep)
            break
    else:
        cut = hard
    for s in spans:  # a mention label is one token
        if s.kind == "mention" and s.start < cut < s.end and s.start > lo:
            cut = s.start
    return max(cut, lo + 1)


def _slice(text: str, spans: list[Span], lo: int, hi: int) -> RichText:
    chunk = text[lo:hi]
    left = len(chunk) - len(chunk.lstrip())
    right = len(chunk.rstrip())
    lo, hi = lo + left, lo + right
    out = RichText(text[lo:hi])
    for s in spans:
        start, end = max(s.start, lo), min(s.end, hi)
        if start < end:
            out.spans.append(replace(s, start=start - lo, end=end - lo))
    return out


# --- RichText → platform text --------------------------------------------------------------------


def render_tree(rich: RichText, text_fn: Callable[[str], str], wrap_fn: Callable[[Span, str, str], str]) -> str:
    """Walk the nested spans: `text_fn` escapes plain runs, `wrap_fn(span, inner, raw)` formats."""

    def walk(lo: int, hi: int, spans: list[Span]) -> str:
        out: list[str] = []
        pos = lo
        i = 0
        while i < len(spans):
            span = spans[i]
            j = i + 1
            while j < len(spans) and spans[j].end <= span.end:
                j += 1
            start = max(span.start, pos)
            out.append(text_fn(rich.text[pos:start]))
            inner = walk(start, span.end, [s for s in spans[i + 1 : j] if s.start >= start])
            out.append(wrap_fn(span, inner, rich.text[start : span.end]))
            pos = max(pos, span.end)
            i = j
        out.append(text_fn(rich.text[pos:hi]))
        return "".join(out)

    return walk(0, len(rich.text), rich.sorted_spans())


def to_plain(rich: RichText) -> str:
    """Plain text: links keep their address visible, everything else is the text itself."""

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "link" and span.url and span.url != raw:
            return f"{inner} ({span.url})"
        return inner

    return render_tree(rich, lambda t: t, wrap)


def slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(rich: RichText) -> str:
    """Slack mrkdwn. Markers must hug non-space characters, so whitespace is moved outside."""
    markers = {"bold": "*", "italic": "_", "strike": "~", "code": "`"}

    def wrap(span: Span, inner: str, raw: str) -> str:
        if span.kind == "mention" and span.user:
            return f"<@{span.user}>"
        if span.kind == "link" and span.url:
            label = slack_escape(raw).replace("|", "¦")
            return f"<{span.url}|{label}>" if label and label != span.url else f"<{span.url}>"
        if span.kind == "pre":
            return f"```\n{slack_escape(raw)}\n```"
        if span.kind == "code":
            return f"`{slack_escape(raw)}`"
        return hug(inner, markers.get(span.kind, ""))

    return render_tree(rich, slack_escape, wrap)


def hug(inner: str, mark: str) -> str:
    """`inner` between `mark`s that hug its non-space characters (markdown dialects ignore a marker
    next to a space), the whitespace moved outside."""
    core = inner.strip()
    if not core or not mark:
        return inner
    lead = inner[: len(inner) - len(inner.lstrip())]
    trail = inner[len(inner.rstrip()) :]
    return f"{lead}{mark}{core}{mark}{trail}"


def pieces_within(rich: RichText, limit: int, render: Callable[[RichText], str], max_chars: int) -> list[str]:
    """`rich` rendered in pieces of at most `max_chars` characters. Splitting counts the plain text;
    escapes and link URLs make the rendering longer, so a piece that grew past the limit is split
    again, smaller (down to 200 characters of text; then cut)."""
    out: list[str] = []
    for piece in split_rich(rich, limit):
        text = render(piece)
        if len(text) > max_chars and limit > 200:
            out.extend(pieces_within(piece, limit * 2 // 3, render, max_chars))
        else:
            out.append(text[:max_chars])
    return out


_TG_KIND = {"bold": "bold", "italic": "italic", "strike": "strikethrough", "code": "code", "pre": "pre"}


def to_telegram_entities(rich: RichText) -> list[dict[str, object]]:
    """Telegram `MessageEntity` dicts with UTF-16 offsets. Mentions of a numeric user id become
    `text_mention`; a mention of `@username` is plain text (Telegram links it by itself)."""
    entities: list[dict[str, object]] = []
    for span in rich.sorted_spans():
        offset = utf16_len(rich.text[: span.start])
        length = utf16_len(rich.text[span.start : span.end])
        if length == 0:
            continue
        entity: dict[str, object] = {"offset": offset, "length": length}
        if span.kind == "link":
            if not span.url:
                continue
            entity.update(type="text_link", url=span.url)
        elif span.kind == "mention":
            if not (span.user and span.user.lstrip("-").isdigit()):
                continue
            label = rich.text[span.start : span.end].lstrip("@") or span.user
            entity.update(type="text_mention", user={"id": int(span.user), "is_bot": False, "first_name": label})
        else:
            entity["type"] = _TG_KIND[span.kind]
            if span.kind == "pre" and span.language:
                entity["language"] = span.language
        entities.append(entity)
    return entities
