"""Broker faults for the chaos bench on a replicated Apache Kafka cluster, and the lag they cause.

`switchboard bench --chaos --kafka-cluster 3 --chaos-kill leader,rolling` runs the chaos load on a
3-node cluster (topics with 3 replicas, `min.insync.replicas=2`) and, in order:

* `leader`: SIGKILL the node leading the most partitions of the pipeline's topics, wait until
  every partition has a leader on another node, leave it down a while, start it again (same ports
  and log dir) and wait until all its replicas are back in sync;
* `rolling`: restart the nodes one at a time (graceful stop, start, wait until in sync), as an
  upgrade does.

Meanwhile the consumer group's lag over the pipeline's topics is read every second. "Normal" is at
most twice the 95th percentile of the samples in the second half of the time before the first fault
(the same load, no fault, past the start-up of the sessions; a healthy pipeline's lag swings with
every commit). Per fault: `lag_normal_again_s`, from its start until the first of
`_NORMAL_RUN` samples in a row within normal, and `lag_recovered_s`, until the lag was within
normal for good (until the next fault, or the end); an unreadable sample counts as above.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.embedded import KafkaCluster
from pipeline.kafka import LagReader

BROKER_FAULTS = ("leader", "rolling")
#: "normal" lag is at least this (an idle pipeline's lag is 0, and a single record is not a backlog)
_LAG_FLOOR = 5
#: samples (seconds) in a row within normal that make the lag normal again
_NORMAL_RUN = 5


def parse_broker_faults(raw: str) -> tuple[str, ...]:
    """`leader`, `rolling` or both comma separated (run in that order); ValueError names a bad one."""
    kinds = tuple(k.strip() for k in raw.split(",") if k.strip())
    unknown = [k for k in kinds if k not in BROKER_FAULTS]
    if unknown or not kinds:
        raise ValueError(f"--chaos-kill: unknown fault(s) {unknown or [raw]}; known: {', '.join(BROKER_FAULTS)}")
    return kinds


@dataclass
class LagWatch:
    """The group's total lag on `topics`, sampled every `interval` seconds from `t0` (None: the read
    failed, e.g. the group coordinator was on the node just killed)."""

    bootstrap: str
    group: str
    topics: list[str]
    t0: float
    interval: float = 1.0
    samples: list[tuple[float, int | None]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        reader: LagReader | None = None
        try:
            while not stop.is_set():
                lag: int | None = None
                try:
                    if reader is None:
                        reader = LagReader(self.bootstrap, request_timeout_ms=5000)
                        await asyncio.wait_for(reader.start(), 10)
                    lag = (await asyncio.wait_for(reader.read(self.group, self.topics), 10)).total
                except Exception:
                    if reader is not None:
                        await reader.stop()
                    reader = None  # a fresh client next time: the old one may hold a dead node
                self.samples.append((round(time.monotonic() - self.t0, 2), lag))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval)
        finally:
            if reader is not None:
                await reader.stop()


async def _wait_leaders_off(cluster: KafkaCluster, topics: Sequence[str], node: int, timeout: float) -> float | None:
    """Seconds until no partition is led by `node` or leaderless (None: not within `timeout`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        with contextlib.suppress(Exception):
            parts = await cluster.partitions(topics)
            if parts and all(p.leader >= 0 and p.leader != node for p in parts):
                return round(time.monotonic() - started, 2)
        await asyncio.sleep(0.25)
    return None


async def run_broker_faults(
    cluster: KafkaCluster,
    kinds: Sequence[str],
    topics: Sequence[str],
    note: Callable[..., None],
    *,
    t0: float,
    start_at: float,
    down_for: float,
    gap: float = 10.0,
) -> list[dict[str, Any]]:
    """The faults in order, the first `start_at` s after `t0`, `gap` s apart; one record each
    (times in seconds from `t0`). `note(fault, **detail)` logs each step."""
    await asyncio.sleep(max(0.0, t0 + start_at - time.monotonic()))
    windows: list[dict[str, Any]] = []
    for index, kind in enumerate(kinds):
        if index:
            await asyncio.sleep(gap)
        start = time.monotonic()
        window: dict[str, Any] = {"fault": kind, "start_s": round(start - t0, 2)}
        if kind == "leader":
            counts = await cluster.leader_counts(topics)
            victim = max(sorted(counts), key=lambda n: counts[n])
            await cluster.kill(victim)
            note("sigkill_kafka_leader", node=victim, leader_counts=dict(counts))
            moved = await _wait_leaders_off(cluster, topics, victim, timeout=120)
            note("leaders_moved", node=victim, seconds=moved)
            await asyncio.sleep(max(0.0, start + down_for - time.monotonic()))
            down_s = time.monotonic() - start
            t = time.monotonic()
            await cluster.start_node(victim)
            restart_s = time.monotonic() - t
            note("kafka_node_restarted", node=victim, seconds=round(restart_s, 2))
            in_sync_s = await cluster.wait_in_sync(topics, timeout=180)
            note("replicas_in_sync", node=victim, seconds=round(in_sync_s, 2))
            window.update(
                node=victim,
                partitions_led=counts[victim],
                partitions=sum(counts.values()),
                leaders_moved_s=moved,
                down_s=round(down_s, 2),
                restart_s=round(restart_s, 2),
                in_sync_after_restart_s=round(in_sync_s, 2),
            )
        elif kind == "rolling":
            note("kafka_rolling_restart_start", nodes=sorted(cluster.nodes))
            window["nodes"] = await cluster.rolling_restart(topics, on_event=note)
        else:
            raise ValueError(f"unknown broker fault {kind!r}")
        window["end_s"] = round(time.monotonic() - t0, 2)
        windows.append(window)
    return windows


def lag_recovery(samples: list[tuple[float, int | None]], windows: list[dict[str, Any]]) -> dict[str, Any]:
    """Add to each window the time from its start until lag was back to normal for good; return
    the normal bound and how it was found."""
    first = min((w["start_s"] for w in windows), default=None)
    before = sorted(lag for t, lag in samples if lag is not None and (first is None or first / 2 <= t < first))
    p95 = before[min(len(before) - 1, int(len(before) * 0.95))] if before else 0
    bound = max(2 * p95, _LAG_FLOOR)
    for index, window in enumerate(windows):
        until = windows[index + 1]["start_s"] if index + 1 < len(windows) else float("inf")
        during = [(t, lag) for t, lag in samples if window["start_s"] <= t < until]
        lags = [lag for _, lag in during if lag is not None]
        window["max_lag"] = max(lags) if lags else None
        window["unreadable_lag_samples"] = sum(1 for _, lag in during if lag is None)
        ok = [lag is not None and lag <= bound for _, lag in during]
        again = next((i for i in range(len(ok) - _NORMAL_RUN + 1) if all(ok[i : i + _NORMAL_RUN])), None)
        window["lag_normal_again_s"] = round(during[again][0] - window["start_s"], 2) if again is not None else None
        bad = [i for i, fine in enumerate(ok) if not fine]
        if not bad:
            window["lag_recovered_s"] = 0.0
        elif bad[-1] + 1 < len(during):
            window["lag_recovered_s"] = round(during[bad[-1] + 1][0] - window["start_s"], 2)
        else:
            window["lag_recovered_s"] = None  # still above normal at the last sample
    return {"normal_lag_bound": bound, "pre_fault_lag_p95": p95, "pre_fault_samples": len(before)}
