"""The ramp's rates: rising by its factor until a step fails, then refined between the highest rate
that passed and the lowest that failed."""

from __future__ import annotations

import math

import pytest

from pipeline.bench.runner import RampRates


def offered(rates: RampRates, passes: set[float]) -> list[float]:
    """The rates `rates` offers when exactly the rates in `passes` pass (rounded to 0.1)."""
    seen = []
    for rate in rates:
        seen.append(round(rate, 1))
        rates.record(round(rate, 1) in passes)
    return seen


def test_the_ramp_rises_until_a_step_fails_then_refines_between() -> None:
    rates = RampRates(100.0, 1.5, 10, 2)
    # 100, 150, 225 pass; 337.5 fails; its geometric mean with 225 (275.6) passes; then 305.0 fails.
    assert offered(rates, {100.0, 150.0, 225.0, 275.6}) == [100.0, 150.0, 225.0, 337.5, 275.6, 305.0]
    assert rates.resolution == pytest.approx(math.sqrt(math.sqrt(1.5)))


def test_without_refining_the_ramp_stops_at_its_first_failing_step() -> None:
    rates = RampRates(100.0, 1.5, 10, 0)
    assert offered(rates, {100.0}) == [100.0, 150.0]
    assert rates.resolution == 1.5


def test_a_first_step_that_fails_has_nothing_to_refine() -> None:
    rates = RampRates(100.0, 1.5, 10, 2)
    assert offered(rates, set()) == [100.0]


def test_a_ramp_that_never_fails_stops_after_its_steps_and_finds_no_ceiling() -> None:
    rates = RampRates(100.0, 2.0, 3, 2)
    assert offered(rates, {100.0, 200.0, 400.0}) == [100.0, 200.0, 400.0]
    assert rates.resolution == 2.0
