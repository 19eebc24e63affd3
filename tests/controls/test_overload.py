"""Overload: how long a message has waited, from its own hop times."""

from __future__ import annotations

from pipeline.controls.overload import OverloadConfig, too_late, waited_seconds


def test_waited_counts_from_ingress_else_ingest() -> None:
    assert waited_seconds({"ingress": 1_000.0, "ingest": 5_000.0}, 11_000.0) == 10.0
    assert waited_seconds({"ingest": 5_000.0}, 11_000.0) == 6.0
    assert waited_seconds({}, 11_000.0) is None


def test_a_message_past_the_bound_is_too_late() -> None:
    bound = OverloadConfig(max_wait_seconds=180)
    assert OverloadConfig().max_wait_seconds == 180  # the default: a few minutes
    assert not too_late(bound, {"ingress": 0.0}, 180_000.0)
    assert too_late(bound, {"ingress": 0.0}, 180_001.0)
    assert not too_late(bound, {}, 10**12)  # no receipt time: never taken for late
    assert not too_late(OverloadConfig(max_wait_seconds=0), {"ingress": 0.0}, 10**12)  # 0: no bound
