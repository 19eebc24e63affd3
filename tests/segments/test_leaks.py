# ruff: noqa: RUF001  (fullwidth and other look-alike characters are the point of these tests)
"""The leak check (S14)."""

from __future__ import annotations

import unicodedata

import pytest

from pipeline.segments import LeakScanner
from pipeline.segments.leaks import (
    _FORMAT_RANGES,
    _MARKERS,
    REDACTION_MARKER,
    Secret,
    _normalise_mapped,
    normalise,
    scan_segments,
)
from pipeline.segments.models import Reply, segment_list_adapter

SCANNER = LeakScanner(["configured-secret-abc", "configured-secret-abc-longer"])


@pytest.mark.parametrize(
    "secret",
    [
        "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789",
        "sk-ant-api03-abcdefghijklmnopqrstuvwxyzABCDEFG_hij",
        "AKIAIOSFODNN7EXAMPLE",
        "ASIAIOSFODNN7EXAMPLE",
        "AKLTYzRlNjE5ZjE0OGY2NDg0ZDk3MjQ5ZjYwZjM",
        "ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
        "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789",
        "xoxb-1234567890-1234567890123-abcdefghijklmnopqrstuvwx",
        "xapp-1-A0123456789-0123456789012-abcdef",
        "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1",
        "Bearer abcdefghijklmnopqrstuvwxyz012345",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
        "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEI",
        "api_key: 'abcdefghijklmnop1234'",
        "configured-secret-abc",
    ],
)
def test_credential_shapes_are_redacted(secret: str) -> None:
    result = SCANNER.scan(f"before {secret} after")
    assert result.hits >= 1
    assert secret not in result.text
    assert REDACTION_MARKER in result.text
    assert result.text.startswith("before ")


@pytest.mark.parametrize(
    "text",
    [
        "The key to success is a good token economy and a secret sauce.",
        "uuid 5e1e5a22-1d5b-4c55-9d23-0123456789ab in a log line",
        "sk-short",
        "AKIA is a prefix",
        "https://example.com/skills-and-tasks",
        "你好世界 🎉",
    ],
)
def test_ordinary_text_is_untouched(text: str) -> None:
    assert SCANNER.scan(text).hits == 0
    assert SCANNER.scan(text).text == text


def test_longest_configured_secret_wins() -> None:
    result = SCANNER.scan("x configured-secret-abc-longer y")
    assert result.text == f"x {REDACTION_MARKER} y" and result.hits == 1


def test_short_configured_secrets_are_matched_as_whole_tokens_only() -> None:
    scanner = LeakScanner([Secret("Ab3dE9", "bot onebot/qq1, credential 'secret'")])
    assert scanner.short_secrets == ("bot onebot/qq1, credential 'secret'",)
    assert scanner.scan("the secret is ab3de9.").text == f"the secret is {REDACTION_MARKER}."
    assert scanner.scan("x Ａｂ３ｄＥ９ y").hits == 1  # normalised like any other secret
    for inside_a_word in ("xab3de9", "ab3de9x", "7ab3de9"):
        assert scanner.scan(inside_a_word).hits == 0, inside_a_word
    assert "Ab3dE9" not in repr(scanner) and "Ab3dE9" not in repr(Secret("Ab3dE9"))


def test_a_secret_of_only_markers_is_reported_and_matches_nothing() -> None:
    scanner = LeakScanner([Secret("**__**", "setting x")])
    assert scanner.short_secrets == ("setting x",)
    assert scanner.scan("some **__** text").hits == 0


def test_nested_strings_and_untouched_segments_are_shared() -> None:
    reply = Reply.model_validate(
        {
            "segments": [
                {"type": "text", "data": {"text": "clean"}},
                {"type": "share", "data": {"url": "https://e.com/?t=configured-secret-abc", "title": "ok"}},
                {
                    "type": "image",
                    "data": {"media": {"kind": "url", "value": "https://e.com/configured-secret-abc.png"}},
                },
                {"type": "face", "data": {"id": "configured-secret-abc"}},
                {"type": "face", "data": {"id": 5}},
            ]
        }
    )
    result = scan_segments(list(reply.segments), SCANNER)
    assert result.hits == 3
    assert result.hit_positions == frozenset({1, 2, 3})
    assert result.segments[0] is reply.segments[0]  # no copy when nothing was found
    assert "configured-secret-abc" not in str([s.model_dump() for s in result.segments])


def test_messages_never_carry_the_secret() -> None:
    # LeakScan holds the redacted text and a count only; nothing else to log.
    result = SCANNER.scan("configured-secret-abc")
    assert "configured-secret-abc" not in repr(result)


# --- normalised matching --------------------------------------------------------------------------

TOKEN = "xoxb-4242-Secret-Value-9fZ"
BOT = LeakScanner([TOKEN])
ZWSP, ZWJ, SHY = "\u200b", "\u200d", "\u00ad"


def fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def percent(text: str) -> str:
    return "".join(f"%{ord(c):02X}" for c in text)


VARIANTS = {
    "exact": TOKEN,
    "lowercase": TOKEN.lower(),
    "uppercase": TOKEN.upper(),
    "zero_width_space": TOKEN[:6] + ZWSP + TOKEN[6:],
    "zero_width_joiner_and_soft_hyphen": ZWJ.join(TOKEN[:5]) + SHY + TOKEN[5:],
    "fullwidth": fullwidth(TOKEN),
    "math_bold_letters": "".join(chr(0x1D400 + ord(c) - 65) if "A" <= c <= "Z" else c for c in TOKEN),
    "markdown_bold_part": f"{TOKEN[:4]}**{TOKEN[4:12]}**{TOKEN[12:]}",
    "markdown_italic_and_code": f"_{TOKEN[:3]}_`{TOKEN[3:]}`",
    "markdown_escapes": TOKEN.replace("-", "\\-"),
    "percent_encoded_all": percent(TOKEN),
    "percent_encoded_part": TOKEN[:5] + percent(TOKEN[5:9]) + TOKEN[9:],
    "percent_encoded_lowercase_hex": percent(TOKEN).lower(),
    "variation_selector": TOKEN[:3] + "\ufe0f" + TOKEN[3:],
    "everything_at_once": f"**{fullwidth(TOKEN[:4])}**{ZWSP}{percent(TOKEN[4:8])}{TOKEN[8:].lower()}",
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_of_a_configured_secret_is_found_and_cut(name: str) -> None:
    variant = VARIANTS[name]
    result = BOT.scan(f"before >{variant}< after")
    assert result.hits == 1
    assert normalise(TOKEN) not in normalise(result.text)
    # Only the secret's own characters are cut (markers around it may stay).
    kept = result.text.removeprefix("before >").removesuffix("< after")
    assert REDACTION_MARKER in kept and not set(normalise(kept.replace(REDACTION_MARKER, ""))) - set(_MARKERS)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_variant_split_across_strings_is_cut_in_each(name: str) -> None:
    variant = VARIANTS[name]
    cut = len(variant) // 2
    result = BOT.scan_texts(["head ", f"text {variant[:cut]}", f"{variant[cut:]} tail", "clean"])
    assert result.hits == 1
    assert normalise(TOKEN) not in normalise("".join(result.texts))
    assert result.texts[0] == "head " and result.texts[3] == "clean"
    assert result.texts[1].startswith("text ") and result.texts[2].endswith(" tail")
    assert result.changed == frozenset({1, 2})


def test_the_exact_characters_are_cut() -> None:
    for variant in (VARIANTS["fullwidth"], VARIANTS["zero_width_space"], VARIANTS["percent_encoded_part"]):
        assert BOT.scan(f"a {variant} b").text == f"a {REDACTION_MARKER} b"
    result = BOT.scan_texts([f"a {TOKEN[:7]}", f"{TOKEN[7:]} b"])
    assert result.texts == [f"a {REDACTION_MARKER}", f"{REDACTION_MARKER} b"]


def test_the_fast_normalisation_and_the_mapped_one_agree() -> None:
    samples = [*VARIANTS.values(), "你好，世界 ｈｅｌｌｏ %E4%BD%A0", "ß ﬁ Ǆ İ ㎒ 😀 \U000e0041", "100% sure %zz %4"]
    for text in samples:
        mapped, starts, ends = _normalise_mapped(text)
        assert mapped == normalise(text)
        assert len(starts) == len(ends) == len(mapped)
        assert all(0 <= s < e <= len(text) for s, e in zip(starts, ends, strict=True))


def test_a_hit_that_only_composition_makes_is_blocked_not_cut() -> None:
    # NFKC composes "e" + U+0301 into "é" over the whole text; the character-by-character mapping
    # cannot, so the hit is reported without positions (`unmappable`) and a single string goes whole.
    scanner = LeakScanner(["café-secret-42"])
    text = "see cafe\u0301-secret-42 here"
    assert _normalise_mapped(text)[0] != normalise(text)
    result = scanner.scan_texts([text])
    assert result.unmappable and result.hits == 1 and result.texts == [text]
    assert scanner.scan(text).text == REDACTION_MARKER
    [segment] = segment_list_adapter.validate_python([{"type": "text", "data": {"text": text}}])
    assert scan_segments([segment], scanner).unmappable


def test_format_ranges_are_unicode_category_cf() -> None:
    in_ranges = {c for a, b in _FORMAT_RANGES for c in range(a, b + 1)}
    assert in_ranges == {c for c in range(0x110000) if unicodedata.category(chr(c)) == "Cf"}


def test_overlapping_and_repeated_secrets_are_counted_once_each() -> None:
    scanner = LeakScanner(["abcdefgh1234", "efgh1234ijkl"])
    result = scanner.scan("abcdefgh1234ijkl and ABCDEFGH1234 and efgh1234ijkl")
    assert result.text == f"{REDACTION_MARKER} and {REDACTION_MARKER} and {REDACTION_MARKER}"
    assert result.hits == 3


def test_clean_strings_are_returned_unchanged() -> None:
    texts = ["plain text", "你好 ｗｏｒｌｄ", "50% off, 100%"]
    result = BOT.scan_texts(texts)
    assert result.hits == 0 and result.changed == frozenset()
    assert all(a is b for a, b in zip(result.texts, texts, strict=True))


def test_a_secret_across_segments_is_cut_in_each_segment() -> None:
    segments = segment_list_adapter.validate_python(
        [
            {"type": "text", "data": {"text": f"token: {TOKEN[:9]}"}},
            {"type": "mention", "data": {"target": "10002"}},
            {"type": "markdown", "data": {"content": f"**{TOKEN[9:]}** ok"}},
        ]
    )
    result = scan_segments(segments, BOT)
    # The mention target sits between the halves: read as one text it breaks the token, no hit.
    assert result.hits == 0
    segments = [segments[0], segments[2]]
    result = scan_segments(segments, BOT)
    assert result.hits == 1 and not result.unmappable
    assert [s.model_dump()["data"] for s in result.segments] == [
        {"text": f"token: {REDACTION_MARKER}"},
        {"content": f"{REDACTION_MARKER}** ok"},  # the markers inside the secret go with it
    ]
    assert result.hit_positions == frozenset({0, 1})


def test_a_secret_only_visible_through_markdown_link_text_is_unmappable() -> None:
    content = f"{TOKEN[:6]}[{TOKEN[6:10]}](https://example.com){TOKEN[10:]}"
    [segment] = segment_list_adapter.validate_python([{"type": "markdown", "data": {"content": content}}])
    result = scan_segments([segment], BOT)
    assert result.unmappable and result.hits == 1


def test_other_bots_and_service_secrets_share_one_scanner() -> None:
    scanner = LeakScanner(
        [
            Secret("tg-webhook-secret-123", "bot telegram/tg1, credential 'webhook_secret'"),
            Secret("slack-signing-secret-456", "bot slack/sl1, credential 'signing_secret'"),
            Secret("redis-password-789", "setting redis_url (password)"),
        ]
    )
    text = "a TG-WEBHOOK-SECRET-123 b slack%2Dsigning%2Dsecret%2D456 c redis-password-789"
    result = scanner.scan(text)
    assert result.hits == 3 and "123" not in result.text and "456" not in result.text and "789" not in result.text
