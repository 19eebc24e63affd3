"""The ramp's rates: rising by its factor until a step fails, then refined between the highest rate
that passed and the lowest that failed."""

from __future__ import annotations

import argparse
import asyncio
import math
from typing import Any, cast

import pytest

from pipeline.bench.runner import RampRates, ramps


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


def test_ramps_interleave_their_steps_and_each_finds_its_own_max() -> None:
    """Two ramps side by side: the same rate for both while both pass, the first of each round
    taking turns; once one fails, it refines alone and the other rises on."""
    args = argparse.Namespace(ramp_start=100.0, ramp_factor=2.0, ramp_steps=4, ramp_refine=1, max_p99_ms=2000.0)
    ceilings = {"pipeline": 300.0, "bare": 1000.0}
    calls: list[tuple[str, float, int]] = []

    async def step(label: str, target: object, rate: float, index: int) -> dict[str, Any]:
        calls.append((label, round(rate, 1), index))
        ok = rate <= ceilings[label]
        figures = {"turns_per_s": rate / 2, "inbound_msgs_per_s": rate, "worker_cpu_ms_per_turn": 3.0}
        return {"offered_msgs_per_s": rate, "ok": ok, **figures}

    targets: list[tuple[str, Any]] = [("pipeline", object()), ("bare", object())]
    pipeline, bare = asyncio.run(ramps(targets, cast(Any, None), args, run_step=step))
    assert calls == [
        ("pipeline", 100.0, 0),
        ("bare", 100.0, 0),
        ("bare", 200.0, 1),  # the second round starts with the other side
        ("pipeline", 200.0, 1),
        ("pipeline", 400.0, 2),
        ("bare", 400.0, 2),
        ("bare", 800.0, 3),
        ("pipeline", 282.8, 3),  # pipeline failed at 400: refined between 200 and 400
    ]
    assert pipeline["max_offered_msgs_per_s"] == pytest.approx(282.8, abs=0.1) and pipeline["ceiling_found"]
    # bare passed its 4 rising steps (no ceiling found: nothing to refine) and stopped there.
    assert bare["max_offered_msgs_per_s"] == 800.0 and not bare["ceiling_found"]
    assert [s["offered_msgs_per_s"] for s in pipeline["steps"]] == sorted(
        s["offered_msgs_per_s"] for s in pipeline["steps"]
    )
