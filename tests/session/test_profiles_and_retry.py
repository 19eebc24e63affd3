"""Profile rules (auth headers, delta encoding, batching per profile, P5) and the retry policy."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pipeline.session import ANTHROPIC, ARK, ProtocolError, RetryPolicy
from pipeline.session.retry import parse_retry_after

USER: dict[str, Any] = {"type": "user.message", "content": [{"type": "text", "text": "x"}]}
SYSTEM: dict[str, Any] = {"type": "system.message", "content": [{"type": "text", "text": "s"}]}
INTERRUPT: dict[str, Any] = {"type": "user.interrupt"}
CONFIRM: dict[str, Any] = {"type": "user.tool_confirmation", "result": "allow", "tool_use_id": "t"}


def test_ark_splits_one_event_per_request_except_user_system_pair() -> None:
    batch = [INTERRUPT, USER, SYSTEM, USER, CONFIRM, USER, SYSTEM]
    assert ARK.split_batch(batch) == [[INTERRUPT], [USER, SYSTEM], [USER], [CONFIRM], [USER, SYSTEM]]


def test_anthropic_sends_the_batch_whole() -> None:
    batch = [INTERRUPT, USER, SYSTEM, CONFIRM]
    assert ANTHROPIC.split_batch(batch) == [batch]
    assert ANTHROPIC.split_batch([]) == []


@pytest.mark.parametrize("profile", [ARK, ANTHROPIC], ids=["ark", "anthropic"])
@pytest.mark.parametrize("batch", [[SYSTEM], [SYSTEM, USER], [USER, INTERRUPT, SYSTEM], [USER, SYSTEM, SYSTEM]])
def test_system_message_placement_is_enforced(profile: object, batch: list[dict[str, object]]) -> None:
    with pytest.raises(ProtocolError):
        profile.split_batch(batch)  # type: ignore[attr-defined]


def test_auth_headers_and_delta_encoding() -> None:
    assert ARK.auth_headers("k") == {"Authorization": "Bearer k"}
    assert ANTHROPIC.auth_headers("k") == {
        "x-api-key": "k",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "managed-agents-2026-04-01",
    }
    types = ["agent.message", "agent.thinking"]
    assert ARK.delta_params(types) == [("event_deltas", "agent.message"), ("event_deltas", "agent.thinking")]
    assert ANTHROPIC.delta_params(types) == [("event_deltas[]", "agent.message"), ("event_deltas[]", "agent.thinking")]
    assert ARK.default_base_url.endswith("/api/v3") and ANTHROPIC.default_base_url.endswith("/v1")


def test_full_jitter_backoff_is_bounded_and_capped() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=4.0, rng=random.Random(1))
    for attempt in range(10):
        ceiling = min(4.0, 0.5 * 2**attempt)
        samples = [policy.backoff(attempt) for _ in range(200)]
        assert all(0 <= s <= ceiling for s in samples)
        assert max(samples) > ceiling * 0.8  # full jitter spans the range
    assert policy.delay(3, retry_after=2.5) == 2.5
    assert policy.delay(3, retry_after=1000) == policy.max_retry_after


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None
    assert parse_retry_after("garbage") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
