"""`switchboard bench --soak`: its pure parts (windows, message ids, slopes, verdicts) and one short
run (full tier) whose JSON has every figure in every window. No assertion on speed."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.bench import LOAD_DURATION, LOAD_RATE, SOAK_DURATION, SOAK_RATE, apply_mode_defaults, build_parser, main
from pipeline.bench.load import Delivery, Sent, TrafficMix, build_plan
from pipeline.bench.soak import (
    P99_RATIO_LIMIT,
    SoakSchedule,
    WindowedReplies,
    chunk_run_id,
    chunk_schedule,
    slope,
    verdicts,
    window_bounds,
    window_of,
    window_record,
)

# ---------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("argv", "rate", "duration"),
    [
        ([], LOAD_RATE, LOAD_DURATION),
        (["--soak"], SOAK_RATE, SOAK_DURATION),
        (["--soak", "--rate", "12", "--duration", "60"], 12.0, 60.0),
        (["--rate", "30"], 30.0, LOAD_DURATION),
    ],
)
def test_rate_and_duration_default_per_mode(argv: list[str], rate: float, duration: float) -> None:
    args = build_parser().parse_args(argv)
    apply_mode_defaults(args)
    assert (args.rate, args.duration) == (rate, duration)


def test_soak_defaults_are_the_issues() -> None:
    args = build_parser().parse_args(["--soak"])
    apply_mode_defaults(args)
    assert (args.duration, args.window, args.warmup, args.rate) == (3600.0, 300.0, 300.0, 80.0)


# ---------------------------------------------------------------------------- windows and message ids


def test_window_bounds_cover_the_duration() -> None:
    assert window_bounds(3600, 300) == [(k * 300.0, (k + 1) * 300.0) for k in range(12)]
    assert window_bounds(50, 20) == [(0, 20), (20, 40), (40, 50)]  # the last one shorter
    assert window_bounds(10, 60) == [(0, 10)]
    with pytest.raises(ValueError):
        window_bounds(0, 10)
    with pytest.raises(ValueError):
        window_bounds(10, 0)


def test_chunks_tile_each_window_and_never_straddle_one() -> None:
    bounds = window_bounds(65, 25)
    chunks = chunk_schedule(bounds, chunk=10)
    for k, (start, end) in enumerate(bounds):
        mine = [(s, length) for w, _, s, length in chunks if w == k]
        assert mine[0][0] == start
        assert math.isclose(sum(length for _, length in mine), end - start)
        assert all(start <= s and s + length <= end + 1e-9 for s, length in mine)
    assert [j for w, j, _, _ in chunks if w == 0] == [0, 1, 2]  # 10 + 10 + 5


def test_window_of_reads_the_window_back_from_a_message_id() -> None:
    plan = build_plan(TrafficMix(conversations=5), 10, 1, run_id=chunk_run_id("abc0c1", 7, 3))
    assert {window_of(s.msg_id) for s in plan.messages} == {7}
    assert window_of("warm-b1-p0") is None  # the warm-up's messages
    assert window_of(None) is None
    assert window_of("abc123-5") is None  # a load phase's


def test_schedule_plans_lazily_and_forgets_a_taken_window() -> None:
    mix = TrafficMix(conversations=20, chat_prefix="cfixed")
    schedule = SoakSchedule(mix, rate=10, bounds=window_bounds(30, 15), base="b00000")
    pairs = list(schedule)
    offsets = [offset for _, offset in pairs]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] < 30
    assert len(pairs) == 300  # 10 msg/s for 30 s
    first = schedule.take(0)
    assert len(first) == 150 and {window_of(i) for i in first} == {0}
    assert all(s.msg_id in first for s, offset in pairs if offset < 15)
    assert schedule.take(0) == {}  # forgotten
    # every chunk talks to the same conversations, as a steady load does
    assert {s.chat_id for s, _ in pairs} <= {f"cfixed-{kind}{i}" for i in range(20) for kind in "pg"}
    assert len(schedule.take(1)) == 150


def _delivery(reply_to: str | None, kind: str = "reply", at: float = 1000.0) -> Delivery:
    hops = {"ingress": at - 300, "ingest": at - 290, "dispatch": at - 250, "stream": at - 100}
    return Delivery("c", kind, reply_to, "", hops, at, f"o-{reply_to}")


def test_replies_are_kept_by_window_until_it_closes() -> None:
    replies = WindowedReplies()
    replies.add(_delivery("bw0c0-1"))
    replies.add(_delivery("bw1c2-7"))
    replies.add(_delivery("warm-x"))
    assert [d.reply_to for d in replies.close(0)] == ["bw0c0-1"]
    replies.add(_delivery("bw0c1-9"))  # after its window closed: counted, not kept
    assert replies.after_close == {0: 1}
    assert replies.close(0) == [] and replies.other == 1 and replies.count == 4
    assert [d.reply_to for d in replies.close(1)] == ["bw1c2-7"]
    assert replies.open == {}


def test_window_record_counts_the_windows_messages_and_replies() -> None:
    sent = {
        f"bw2c0-{i}": Sent(f"bw2c0-{i}", "c", "private", i % 2 == 0, 600.0, b"{}", acked_ms=605.0, attempts=1)
        for i in range(4)
    }
    deliveries = [_delivery("bw2c0-0"), _delivery("bw2c0-2"), _delivery("bw2c0-2", kind="notice")]
    before = {"at": 10.0, "cpu_s": {"worker0": 1.0, "broker": 2.0}, "ingested": 10.0, "loop_stalls": 0.0}
    after = {
        "at": 20.0,
        "cpu_s": {"worker0": 1.5, "broker": 2.5},
        "ingested": 14.0,
        "loop_stalls": 1.0,
        "messages_total": 40,
        "rss_mib": {"worker0": 120.0},
        "redis": {"used_memory_mib": 1.0, "keys": 3, "keys_with_expiry": 3},
    }
    w = window_record(2, (20.0, 30.0), 20.0, sent, deliveries, before, after)
    assert w["messages"] == {"sent": 4, "accepted": 4, "triggering": 2, "ingested": 4}
    assert (w["replies"], w["notices"], w["warmup"]) == (2, 1, False)
    assert w["latency_ms"]["end_to_end"]["n"] == 2 and w["latency_ms"]["end_to_end"]["p99"] == 300.0
    assert w["latency_ms"]["pipeline_overhead"]["p99"] == 150.0  # 300 ms less the agent's 150
    assert w["worker_cpu_ms_per_turn"] == 250.0 and w["worker_cpu_pct"] == 5.0
    assert w["worker_loop_stalls"] == 1 and w["cpu_s"] == {"worker0": 0.5, "broker": 0.5}


# ---------------------------------------------------------------------------- slopes and verdicts


def test_slope_is_the_least_squares_one() -> None:
    assert slope([(0, 1.0), (10, 2.0), (20, 3.0)]) == pytest.approx(0.1)
    assert slope([(0, 0.0), (1, 1.0), (2, 0.0), (3, 1.0)]) == pytest.approx(0.2)
    assert slope([(0, 1.0), (5, None), (10, math.nan), (20, 3.0)]) == pytest.approx(0.1)
    assert slope([(0, 1.0)]) is None
    assert slope([(5, 1.0), (5, 2.0)]) is None


def _window(
    k: int,
    *,
    rss: float = 120.0,
    p99: float | None = 100.0,
    messages: int | None = None,
    keys: int = 1000,
    persistent: int = 5,
    memory: float = 10.0,
    late: int = 0,
    window: float = 300.0,
) -> dict[str, Any]:
    return {
        "window": k,
        "start_s": k * window,
        "end_s": (k + 1) * window,
        "messages_total": messages if messages is not None else (k + 1) * 24_000,
        "rss_mib": {"worker0": rss, "broker": 50.0},
        "redis": {"used_memory_mib": memory, "keys": keys, "keys_with_expiry": keys - persistent},
        "latency_ms": {"pipeline_overhead": {"p99": p99}},
        "replies_after_close": late,
    }


START = {
    "messages_total": 0,
    "rss_mib": {"worker0": 100.0, "broker": 40.0},
    "redis": {"used_memory_mib": 10.0, "keys": 1000, "keys_with_expiry": 995},
}


def test_a_flat_run_meets_every_target_and_the_warmup_is_not_judged() -> None:
    # the warm-up window grew (100 → 120 MiB, p99 900 ms): not judged
    windows = [_window(0, p99=900.0)] + [_window(k, p99=100.0 + k) for k in range(1, 6)]
    v = verdicts(START, windows, warmup=300)
    assert v["post_warmup_windows"] == 5 and v["ok"] is True
    assert v["worker_rss"]["by_worker"]["worker0"]["at_warmup_end_mib"] == 120.0  # the end of window 0
    assert v["worker_rss"]["by_worker"]["worker0"]["growth_pct"] == 0.0
    assert v["rss_slope_mib_per_10k_msgs"] == {"broker": 0.0, "worker0": 0.0}
    assert v["overhead_p99"]["first_window_ms"] == 101.0 and v["overhead_p99"]["windows_over"] == []
    assert v["redis"]["keys_ok"] and v["redis"]["memory_ok"] and v["redis"]["keys_slope_per_10k_msgs"] == 0.0


def test_worker_memory_growth_beyond_five_percent_misses_and_its_slope_is_per_10k_messages() -> None:
    # +1 MiB per window of 24,000 messages: 10,000/24,000 MiB per 10k
    windows = [_window(k, rss=120.0 + k) for k in range(8)]
    v = verdicts(START, windows, warmup=300)
    assert v["rss_slope_mib_per_10k_msgs"]["worker0"] == pytest.approx(10_000 / 24_000, abs=1e-3)
    assert v["worker_rss"]["by_worker"]["worker0"]["growth_pct"] == round(
        7 / 120 * 100, 2
    )  # window 0 ends the warm-up at 120
    assert v["worker_rss"]["ok"] is False and v["ok"] is False
    # within +5%: met
    v = verdicts(START, [_window(k, rss=120.0 + k * 0.5) for k in range(8)], warmup=300)
    assert v["worker_rss"]["ok"] is True


def test_a_window_whose_overhead_p99_is_over_1_5x_the_first_misses() -> None:
    windows = [_window(0), _window(1, p99=100.0), _window(2, p99=149.0), _window(3, p99=151.0)]
    v = verdicts(START, windows, warmup=300)
    assert v["overhead_p99"]["ratio_by_window"] == [1.0, 1.49, 1.51]
    assert v["overhead_p99"]["windows_over"] == [3] and v["overhead_p99"]["max_ratio"] > P99_RATIO_LIMIT
    assert v["overhead_p99"]["ok"] is False and v["ok"] is False


def test_a_window_without_replies_or_with_late_ones_misses() -> None:
    v = verdicts(START, [_window(0), _window(1), _window(2, p99=None)], warmup=300)
    assert v["overhead_p99"]["windows_over"] == [2] and v["overhead_p99"]["ok"] is False
    v = verdicts(START, [_window(0), _window(1), _window(2, late=3)], warmup=300)
    assert v["overhead_p99"]["replies_after_close"] == 3 and v["overhead_p99"]["ok"] is False


def test_redis_keys_without_an_expiry_must_not_grow_and_memory_must_stay_within_five_percent() -> None:
    windows = [_window(k, persistent=5 + 20 * k) for k in range(4)]
    v = verdicts(START, windows, warmup=300)
    assert v["redis"]["keys_without_expiry_at_warmup_end"] == 5 and v["redis"]["keys_without_expiry_max"] == 65
    assert v["redis"]["keys_ok"] is False and v["ok"] is False
    windows = [_window(k, memory=10.0 + k, keys=1000 + 2400 * k) for k in range(4)]
    v = verdicts(START, windows, warmup=300)
    assert v["redis"]["used_memory_growth_pct"] == 30.0 and v["redis"]["memory_ok"] is False
    assert v["redis"]["keys_slope_per_10k_msgs"] == pytest.approx(1000.0)
    assert v["redis"]["keys_ok"] is True


def test_without_a_window_after_the_warmup_nothing_is_judged() -> None:
    v = verdicts(START, [_window(0), _window(1)], warmup=600)
    assert v["ok"] is None and v["post_warmup_windows"] == 0
    # no warm-up: judged from the sample before the load
    v = verdicts(START, [_window(0, rss=100.0), _window(1, rss=100.0)], warmup=0)
    assert v["worker_rss"]["by_worker"]["worker0"]["at_warmup_end_mib"] == 100.0 and v["ok"] is True


# ---------------------------------------------------------------------------- one short run (full tier)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_short_soak_run(tmp_path: Path) -> None:
    """A minute at 10 msg/s in three windows of 20 s, the first the warm-up: every window has its
    figures, the verdicts are there, the exit code says whether they were met."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_") and k != "SWITCHBOARD_TEST_BROKERS"}
    argv = ["--soak", "--duration", "60", "--window", "20", "--warmup", "20", "--rate", "10", "--think", "0.02"]
    try:
        code = main([*argv, "--out", str(tmp_path), "--name", "soak", "--conversations", "50"])
    finally:
        os.environ.update(saved)
    result = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 1000
    assert code == (0 if result["ok"] else 1)
    soak = result["soak"]["tansu"]
    assert soak["messages"]["accepted"] == soak["messages"]["sent"] == 600 and soak["messages"]["failed"] == 0
    windows = soak["windows"]
    assert [(w["start_s"], w["end_s"], w["warmup"]) for w in windows] == [
        (0, 20, True),
        (20, 40, False),
        (40, 60, False),
    ]
    for w in windows:
        assert w["messages"]["sent"] == w["messages"]["accepted"] == 200
        assert 0 < w["replies"] <= w["messages"]["triggering"]
        for name in ("end_to_end", "pipeline_overhead", "client_end_to_end"):
            s = w["latency_ms"][name]
            assert s["n"] == w["replies"], name
            assert 0 <= s["p50"] <= s["p99"] <= s["max"], (name, s)
        assert set(w["rss_mib"]) == {"worker0", "broker", "redis", "sim", "bench"}
        assert all(0 < mib < 4096 for mib in w["rss_mib"].values())
        assert w["worker_cpu_ms_per_turn"] > 0 and w["cpu_s"]["worker0"] > 0
        assert w["redis"]["keys"] > 0 and w["redis"]["used_memory_mib"] > 0
        assert 0 <= w["redis"]["keys_with_expiry"] <= w["redis"]["keys"]
        assert w["replies_after_close"] >= 0
    # accepted so far, sampled at each window's end (a message of the next may just have been accepted)
    assert all(abs(w["messages_total"] - 200 * (k + 1)) <= 3 for k, w in enumerate(windows))
    t = soak["targets"]
    assert t["post_warmup_windows"] == 2
    assert set(t["rss_slope_mib_per_10k_msgs"]) == {"worker0", "broker", "redis", "sim", "bench"}
    assert t["worker_rss"]["by_worker"]["worker0"]["at_warmup_end_mib"] == windows[0]["rss_mib"]["worker0"]
    assert t["overhead_p99"]["first_window_ms"] == windows[1]["latency_ms"]["pipeline_overhead"]["p99"]
    assert t["ok"] == (t["worker_rss"]["ok"] and t["redis"]["ok"] and t["overhead_p99"]["ok"])
    assert result["headline"]["tansu"]["ok"] == t["ok"] == soak["ok"]
