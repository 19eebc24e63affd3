"""The shared rich-text helpers: the markdown subset, splitting, and the three renderings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.platforms._richtext import (
    RichText,
    parse_markdown,
    split_rich,
    to_mrkdwn,
    to_plain,
    to_telegram_entities,
    utf16_len,
    utf16_slice,
)


def spans(rich: RichText) -> list[tuple[str, str]]:
    return [(s.kind, rich.text[s.start : s.end]) for s in rich.sorted_spans()]


def test_markdown_subset() -> None:
    rich = parse_markdown(
        "## Plan\n1. read **the _whole_ file**\n- call `my_func(a_b)` on snake_case_name\n\\*not bold\\*"
    )
    assert rich.text == "Plan\n1. read the whole file\n• call my_func(a_b) on snake_case_name\n*not bold*"
    assert spans(rich) == [("bold", "Plan"), ("bold", "the whole file"), ("italic", "whole"), ("code", "my_func(a_b)")]


def test_fenced_code_links_and_unclosed_markers() -> None:
    rich = parse_markdown(
        "see [the docs](https://x.test/a_b) or <https://y.test>\n```sh\nrm -rf **not bold**\n```\n2 * 3 * 4 **open"
    )
    assert ("pre", "rm -rf **not bold**") in spans(rich)
    links = [(s.url, rich.text[s.start : s.end]) for s in rich.spans if s.kind == "link"]
    assert links == [("https://x.test/a_b", "the docs"), ("https://y.test", "https://y.test")]
    assert rich.text.endswith("2 * 3 * 4 **open")
    assert to_plain(rich).startswith("see the docs (https://x.test/a_b) or https://y.test\n")


def test_split_clips_spans_and_keeps_mentions_whole() -> None:
    rich = RichText()
    rich.append("x" * 8 + " ")
    rich.append("@someone", "mention", user="U1")
    rich.append(" " + "bold words here", "bold")
    pieces = split_rich(rich, 12)
    assert all(len(p.text) <= 12 for p in pieces)
    assert any(p.text.startswith("@someone") and p.spans[0].kind == "mention" for p in pieces)
    for piece in pieces:
        for span in piece.spans:
            assert 0 <= span.start < span.end <= len(piece.text)
    assert "".join(p.text for p in pieces).replace(" ", "") == rich.text.replace(" ", "")


def test_utf16_split_and_entities() -> None:
    rich = RichText()
    rich.append("😀" * 10, "bold")
    [a, b] = split_rich(rich, 12, utf16=True)
    assert utf16_len(a.text) == 12 and utf16_len(b.text) == 8
    assert to_telegram_entities(b) == [{"offset": 0, "length": 8, "type": "bold"}]


@settings(max_examples=200)
@given(
    text=st.text(max_size=12) | st.text(st.characters(max_codepoint=127), max_size=12),
    offset=st.integers(-15, 15),
    length=st.integers(-15, 15),
)
def test_utf16_helpers_count_as_the_encoding_does(text: str, offset: int, length: int) -> None:
    # ASCII takes a path without encoding: it must agree with the UTF-16 encoding, negative and
    # out-of-range offsets included (hypothesis's text has no lone surrogates, which cannot encode).
    data = text.encode("utf-16-le")
    assert utf16_len(text) == len(data) // 2
    expected = data[offset * 2 : (offset + length) * 2].decode("utf-16-le", errors="replace")
    assert utf16_slice(text, offset, length) == expected


def test_mrkdwn_hugs_markers_and_escapes() -> None:
    rich = RichText()
    rich.append(" padded ", "bold")
    rich.append("a<b>&c")
    rich.append("lbl|x", "link", url="https://z.test")
    assert to_mrkdwn(rich) == " *padded* a&lt;b&gt;&amp;c<https://z.test|lbl¦x>"


PATHOLOGICAL = [
    "*a " * 10000,
    "_a " * 10000,
    "**a " * 8000,
    "[a](" * 8000,
    "![x](" * 6000,
    "[" * 30000,
    "``a `" * 6000,
    "*_" * 2000 + "a" + "_*" * 2000,
    "~~**__" * 1000 + "x" + "__**~~" * 1000,
]


def test_pathological_markdown_is_handled() -> None:
    # Unclosed markers once made the parser quadratic (minutes on 32k chars); deep nesting must
    # not recurse without bound.
    for src in PATHOLOGICAL:
        rich = parse_markdown(src)
        assert to_mrkdwn(rich)
        for piece in split_rich(rich, 4096, utf16=True):
            to_telegram_entities(piece)


@settings(max_examples=150, deadline=None)
@given(src=st.text(alphabet="ab *_~`[]()<>#-\n\\😀", max_size=120), limit=st.integers(min_value=5, max_value=40))
def test_any_markdown_renders_within_limits(src: str, limit: int) -> None:
    rich = parse_markdown(src)
    for span in rich.spans:
        assert 0 <= span.start < span.end <= len(rich.text)
    pieces = split_rich(rich, limit, utf16=True)
    for piece in pieces:
        assert 0 < utf16_len(piece.text) <= limit
        for entity in to_telegram_entities(piece):
            assert entity["offset"] + entity["length"] <= utf16_len(piece.text)  # type: ignore[operator]
    to_mrkdwn(rich)
    to_plain(rich)
