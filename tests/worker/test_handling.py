"""One retry / dead-letter path for every stage."""

from __future__ import annotations

import pytest
from redis.exceptions import BusyLoadingError

from pipeline.worker.handling import Handling, backoff


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8]
    assert backoff(30) == 5.0


async def test_transient_errors_are_retried_with_backoff() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    attempts = 0

    async def call() -> str:
        nonlocal attempts
        attempts += 1
        if attempts < 3:
            raise BusyLoadingError("loading the AOF")
        return "done"

    assert await Handling("ingest", sleep=sleep).retrying(call) == "done"
    assert slept == [backoff(1), backoff(2)]


async def test_other_errors_propagate_from_retrying_and_are_dead_lettered_by_run() -> None:
    async def broken() -> None:
        raise KeyError("field")

    with pytest.raises(KeyError):
        await Handling("render").retrying(broken)
    letters: list[tuple[str, str]] = []

    async def dead_letter(reason: str, error: str) -> None:
        letters.append((reason, error))

    await Handling("render").run(broken, dead_letter)
    assert letters == [("handler_error", "KeyError('field')")]
