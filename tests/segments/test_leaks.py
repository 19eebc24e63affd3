"""The leak check (S14)."""

from __future__ import annotations

import pytest

from pipeline.segments import LeakScanner
from pipeline.segments.leaks import REDACTION_MARKER, scan_segments
from pipeline.segments.models import Reply

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


def test_short_configured_secrets_are_refused() -> None:
    with pytest.raises(ValueError):
        LeakScanner(["abc"])


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
