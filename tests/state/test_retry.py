"""Waiting out Redis unavailability, shared by the stages and the worker."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from pipeline.state.retry import backoff, while_unavailable


async def test_unavailability_is_waited_out_and_logged_with_what_was_being_done(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slept: list[float] = []
    calls = 0

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def inflight() -> list[str]:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise RedisConnectionError("Connection refused")
        return ["sess_1"]

    with caplog.at_level(logging.WARNING, logger="pipeline.state.retry"):
        result = await while_unavailable(inflight, stage="streams", doing="resuming partition 2", sleep=sleep)
    assert result == ["sess_1"]
    assert slept == [backoff(1), backoff(2)]
    assert [r.getMessage() for r in caplog.records] == [
        "streams: resuming partition 2: ConnectionError; retry 1",
        "streams: resuming partition 2: ConnectionError; retry 2",
    ]


async def test_other_errors_are_not_retried() -> None:
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise KeyError("not Redis")

    with pytest.raises(KeyError):
        await while_unavailable(broken, stage="streams")
    assert calls == 1
