"""The bench's latency split, from the hop timestamps a delivered reply carries."""

from __future__ import annotations

from pipeline.bench.load import Delivery, latency_report


def reply(hops: dict[str, float], delivered_at: float) -> Delivery:
    return Delivery("c", "reply", None, "echo", hops, delivered_at, "out-1")


def test_overhead_is_end_to_end_minus_agent_and_busy_wait_is_kept_apart() -> None:
    straight = reply({"ingress": 0, "dispatch": 50, "stream": 150}, 200)  # 100 agent, 100 overhead
    # Held 300 ms behind the chat's running turn, then 100 ms of agent: 100 ms of own overhead.
    held = reply({"ingress": 0, "held": 40, "released": 340, "dispatch": 350, "stream": 450}, 500)
    report = latency_report([straight, held], {})
    assert report.end_to_end["max"] == 500
    assert report.overhead["max"] == 400  # the busy wait counts as overhead here…
    assert report.busy_wait["n"] == 1 and report.busy_wait["max"] == 300
    assert report.overhead_excluding_busy_wait["max"] == 100  # …and not here
    assert report.overhead_excluding_busy_wait["n"] == 2


def test_notices_and_replies_without_hops_are_left_out() -> None:
    notice = Delivery("c", "notice", None, "x", {"ingress": 0}, 10, "out-2")
    bare = reply({}, 10)
    report = latency_report([notice, bare], {})
    assert report.end_to_end.get("n", 0) == 0
