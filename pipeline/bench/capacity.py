"""Capacity: the per-turn costs with N = 1, 2, 4 … worker processes, and the model's check.

For each N a fresh stack (same broker, partitions and traffic) runs: an idle window (what a worker
costs doing nothing), a fixed offered load below saturation, a phase of only non-triggering group
messages, and the `--mode max` ramp. Every process the bench starts is accounted for: each worker's
CPU and the turns it delivered, the broker's, Redis's and the simulator's CPU, the bench process's
own (load generator and meters), Kafka records and their bytes, Redis commands and bytes, session
API calls. With `--pin-workers`/`--pin-others` the workers run on one CPU set and everything else
on another (`sched_setaffinity` on every thread), so the model's prediction — capacity = cores
given to workers ÷ CPU per turn — is tested against what those cores delivered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import time
from pathlib import Path
from typing import Any

import httpx

from pipeline.bench.load import TrafficMix
from pipeline.bench.measure import (
    CpuSetMeter,
    KafkaWatermarks,
    kafka_record_bytes,
    metric_sum,
    proc_cpu_seconds,
    redis_net_bytes,
    scrape_metrics,
)
from pipeline.bench.runner import BenchStack, log, ramp, run_phase, start_stack, warm_up

INFRA = ("broker", "redis", "sim")  # the processes besides the workers; the bench process is added apart


def parse_cpus(spec: str) -> set[int]:
    """`0`, `0,1`, `0-3` or `0-1,3` → a CPU set (what `taskset -c` takes)."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ValueError(f"not a CPU list: {spec!r} (e.g. 0, 0-1, 0,2)")
        cpus.update(range(int(first), int(last or first) + 1))
    if not cpus:
        raise ValueError(f"empty CPU list: {spec!r}")
    return cpus


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for tid in _tasks(pid):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(c) for c in f.read().split()]
    return kids


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` and of its descendants onto `cpus` (threads created later inherit it).
    Repeated until no new thread shows up, so one created during the walk is not missed."""
    done: set[int] = set()
    for _ in range(5):
        todo = [pid]
        fresh = 0
        while todo:
            p = todo.pop()
            for tid in _tasks(p):
                if tid not in done:
                    with contextlib.suppress(OSError):
                        os.sched_setaffinity(tid, cpus)
                        done.add(tid)
                        fresh += 1
            todo += _children(p)
        if not fresh:
            return


def allowed_cpus(pid: int | None) -> list[int]:
    """Union of the CPUs the threads of `pid` may run on (checks the pinning held)."""
    cpus: set[int] = set()
    for tid in _tasks(pid) if pid else []:
        with contextlib.suppress(OSError):
            cpus |= os.sched_getaffinity(tid)
    return sorted(cpus)


async def _worker_meters(bs: BenchStack, http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for i, w in enumerate(w for w in (bs.stack.workers if bs.stack else []) if w.is_running):
        m = await scrape_metrics(w.url, http)
        calls: dict[str, float] = {}
        for key, value in m.items():
            base, _, labels = key.partition("{")
            if base == "switchboard_session_calls_total":
                call = labels.split('call="', 1)[1].split('"', 1)[0] if 'call="' in labels else "?"
                calls[call] = calls.get(call, 0.0) + value
        out[f"worker{i}"] = {
            "pid": w.pid,
            "delivered": metric_sum(m, "switchboard_egress_total", outcome="sent"),
            "triggered": metric_sum(m, "switchboard_turns_triggered_total"),
            "filtered": metric_sum(m, "switchboard_inbound_filtered_total"),
            "partitions": metric_sum(m, "switchboard_partitions_assigned"),
            "session_calls": calls,
        }
    return out


async def _await_assignment(bs: BenchStack, http: httpx.AsyncClient, timeout: float = 90.0) -> dict[str, float]:
    """Until every worker owns partitions and the total is stable for 3 s (the group settled)."""
    deadline = time.monotonic() + timeout
    last, since = -1.0, time.monotonic()
    owned: dict[str, float] = {}
    while time.monotonic() < deadline:
        owned = {name: m["partitions"] for name, m in (await _worker_meters(bs, http)).items()}
        total = sum(owned.values())
        if total != last:
            last, since = total, time.monotonic()
        elif all(v > 0 for v in owned.values()) and time.monotonic() - since >= 3:
            break
        await asyncio.sleep(0.5)
    return owned


class _Snapshot:
    """What `run_phase` does not read: per-worker turns and session calls, bytes on Kafka, Redis
    and the broker's sockets."""

    def __init__(self, bs: BenchStack, http: httpx.AsyncClient, kafka: KafkaWatermarks) -> None:
        self.bs, self.http, self.kafka = bs, http, kafka

    async def take(self) -> dict[str, Any]:
        return {
            "workers": await _worker_meters(self.bs, self.http),
            "offsets": await self.kafka.by_partition(self.bs.kafka_prefixes),
            "redis_net": await redis_net_bytes(self.bs.redis),
        }


def _per(value: float | None, turns: int, scale: float = 1.0, digits: int = 2) -> float | None:
    return round(value * scale / turns, digits) if turns and value is not None else None


async def _measured(
    bs: BenchStack,
    http: httpx.AsyncClient,
    mix: TrafficMix,
    rate: float,
    duration: float,
    label: str,
    cpu_sets: CpuSetMeter,
) -> dict[str, Any]:
    """One `run_phase` with the extra meters around it; figures per turn and per inbound message."""
    kafka = KafkaWatermarks(bs.bootstrap)
    await kafka.start()
    try:
        snap = _Snapshot(bs, http, kafka)
        before = await snap.take()
        cpu_sets.start()
        phase = await run_phase(bs, mix, rate, duration, label=label, progress=False)
        busy = cpu_sets.stop()
        after = await snap.take()
    finally:
        await kafka.stop()
    d = phase.data
    turns, inbound = d["turns"], d["messages"]["accepted"]
    kbytes = await kafka_record_bytes(bs.bootstrap, before["offsets"], after["offsets"])
    seconds = d["cpu"]["seconds"]
    per_worker = {}
    calls: dict[str, float] = {}
    for name, w in after["workers"].items():
        w0 = before["workers"].get(name, {})
        delivered = w["delivered"] - w0.get("delivered", 0.0)
        cpu = seconds.get(name)
        per_worker[name] = {
            "cpu_s": cpu,
            "delivered": int(delivered),
            "triggered": int(w["triggered"] - w0.get("triggered", 0.0)),
            "filtered": int(w["filtered"] - w0.get("filtered", 0.0)),
            "partitions": w["partitions"],
            "cpu_ms_per_delivered": round(cpu * 1000 / delivered, 2) if cpu is not None and delivered else None,
            "pct_of_core": round(cpu / d["wall_s"] * 100, 1) if cpu is not None else None,
        }
        for call, n in w["session_calls"].items():
            calls[call] = calls.get(call, 0.0) + n - w0.get("session_calls", {}).get(call, 0.0)
    worker_cpu = sum(v["cpu_s"] or 0.0 for v in per_worker.values())
    infra = {name: seconds.get(name) for name in INFRA}
    infra["bench"] = d["cpu"]["bench_process_seconds"]  # the load generator thread and the meters
    infra_cpu = sum(v for v in infra.values() if v is not None and not math.isnan(v))
    records = sum(v["records"] for v in kbytes.values())
    record_bytes = sum(v["bytes"] for v in kbytes.values())
    out = {
        "label": label,
        "offered_msgs_per_s": rate,
        "duration_s": duration,
        "wall_s": d["wall_s"],
        "accepted": inbound,
        "filtered": d["messages"]["filtered"],
        "turns": turns,
        "turns_per_s": d["throughput"]["turns_per_s"],
        "inbound_msgs_per_s": d["throughput"]["inbound_msgs_per_s"],
        "e2e_ms": {k: d["latency_ms"]["end_to_end"].get(k) for k in ("p50", "p99")},
        "per_worker": per_worker,
        "cpu_s": {"workers": round(worker_cpu, 2), **{k: v for k, v in infra.items()}},
        "cpu_sets_busy": busy,
        "cpu_pct_of_core": {
            "workers": round(worker_cpu / d["wall_s"] * 100, 1),
            **{k: round(v / d["wall_s"] * 100, 1) for k, v in infra.items() if v is not None and not math.isnan(v)},
        },
        "worker_cpu_ms_per_turn": _per(worker_cpu, turns, 1000),
        "worker_cpu_us_per_inbound": _per(worker_cpu, inbound, 1e6, 1),
        "infra_cpu_ms_per_turn": {
            **{k: _per(v, turns, 1000) for k, v in infra.items() if v is not None and not math.isnan(v)},
            "total": _per(infra_cpu, turns, 1000),
        },
        "kafka": {
            "records_per_turn": _per(records, turns),
            "record_bytes_per_turn": _per(record_bytes, turns, digits=0),
            "by_topic_per_turn": {
                t: {"records": _per(v["records"], turns), "bytes": _per(v["bytes"], turns, digits=0)}
                for t, v in sorted(kbytes.items())
            },
            "records_per_inbound": _per(records, inbound),
        },
        "redis": {
            "commands_per_turn": (d.get("redis") or {}).get("ops_per_turn"),
            "round_trips_per_turn": (d.get("redis") or {}).get("round_trips_per_turn"),
            "commands_per_inbound": (d.get("redis") or {}).get("ops_per_inbound_msg"),
            "net_bytes_per_turn": _per(after["redis_net"] - before["redis_net"], turns, digits=0),
            "by_command_per_turn": (d.get("redis") or {}).get("per_turn_by_command"),
        },
        "session_calls_per_turn": {k: _per(v, turns) for k, v in sorted(calls.items()) if v},
        "deliveries_per_turn": _per(sum(v["delivered"] for v in per_worker.values()), turns),
    }
    log(
        f"{label}: {out['turns_per_s']} turns/s, worker CPU {out['worker_cpu_ms_per_turn']} ms/turn "
        f"({out['cpu_pct_of_core']['workers']}% of a core), others {out['infra_cpu_ms_per_turn']['total']} ms/turn, "
        f"Kafka {out['kafka']['records_per_turn']} records / {out['kafka']['record_bytes_per_turn']} B per turn"
    )
    return out


async def _idle(bs: BenchStack, seconds: float = 5.0) -> dict[str, float]:
    """CPU per second of each process while nothing is offered (timers, fetch loops, heartbeats)."""
    pids = {**bs.pids(), "bench": os.getpid()}
    c0 = {n: proc_cpu_seconds(p) for n, p in pids.items()}
    await asyncio.sleep(seconds)
    return {
        n: round((proc_cpu_seconds(p) - c0[n]) / seconds * 100, 2) for n, p in pids.items() if not math.isnan(c0[n])
    }


def _pin(bs: BenchStack, workers: set[int] | None, others: set[int] | None) -> dict[str, list[int]]:
    for name, pid in bs.pids().items():
        cpus = workers if name.startswith("worker") else others
        if pid and cpus:
            pin_tree(pid, cpus)
    return {name: allowed_cpus(pid) for name, pid in {**bs.pids(), "bench": os.getpid()}.items()}


async def one_count(
    args: argparse.Namespace, n: int, mix: TrafficMix, workers: set[int] | None, others: set[int] | None
) -> dict[str, Any]:
    cpu_sets = CpuSetMeter(
        {"workers": workers, "others": others} if workers and others else {"all": set(range(os.cpu_count() or 1))}
    )
    bs = await start_stack(
        broker=args.broker if args.broker != "both" else "tansu",
        workers=n,
        think=args.think,
        run_dir=(args.run_dir / f"n{n}") if args.run_dir else None,
        partitions=args.partitions,
        log_level=args.log_level,
        extra_env=dict(kv.split("=", 1) for kv in args.env),
    )
    out: dict[str, Any] = {"workers": n, "loadavg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()]}
    http = httpx.AsyncClient(timeout=5)
    try:
        out["cpus_allowed"] = _pin(bs, workers, others)
        out["partitions_owned"] = await _await_assignment(bs, http)
        log(f"{n} worker(s): partitions {out['partitions_owned']}, CPUs {out['cpus_allowed']}")
        await warm_up(bs, mix)
        out["idle_pct_of_core"] = await _idle(bs)
        out["fixed"] = await _measured(bs, http, mix, args.rate, args.duration, f"{n}w fixed {args.rate:g}/s", cpu_sets)
        only_filtered = dataclasses.replace(mix, private_share=0.0, filtered_share=1.0, burst_prob=0.0)
        filtered = await run_phase(bs, only_filtered, args.filtered_rate, 10.0, label=f"{n}w filtered", progress=False)
        fd = filtered.data
        accepted = max(fd["messages"]["accepted"], 1)
        fseconds = fd["cpu"]["seconds"]
        others_cpu = {**{k: fseconds.get(k) for k in INFRA}, "bench": fd["cpu"]["bench_process_seconds"]}
        out["filtered_only"] = {
            "offered_msgs_per_s": args.filtered_rate,
            "accepted": fd["messages"]["accepted"],
            "ingested": fd["messages"]["ingested"],
            "worker_cpu_us_per_msg": round(
                sum(v for k, v in fseconds.items() if k.startswith("worker")) * 1e6 / accepted, 1
            ),
            "infra_cpu_us_per_msg": {
                k: round(v * 1e6 / accepted, 1) for k, v in others_cpu.items() if v is not None and not math.isnan(v)
            },
            "kafka_records_per_msg": fd["kafka"]["records_per_inbound_msg"],
            "redis_commands_per_msg": (fd.get("redis") or {}).get("ops_per_inbound_msg"),
        }
        log(f"{n}w filtered only: {out['filtered_only']}")
        out["max"] = await ramp(bs, mix, args, label=f"{n}w ramp", cpu_sets=cpu_sets)
        out["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
        out["cpus_allowed_at_end"] = {
            name: allowed_cpus(pid) for name, pid in {**bs.pids(), "bench": os.getpid()}.items()
        }
    finally:
        await http.aclose()
        await bs.close()
    return out


def _peak(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The step that delivered the most turns/s, passing or not, with the workers' share of a core."""
    if not steps:
        return {}
    best = max(steps, key=lambda s: s.get("turns_per_s") or 0.0)
    cores = best.get("cpu_pct_by_process") or {}
    ours_w = round(sum(v for k, v in cores.items() if k.startswith("worker")), 1)
    ours_o = round(sum(v for k, v in cores.items() if not k.startswith("worker")), 1)
    busy = best.get("cpu_sets_busy") or {}
    out = {
        "turns_per_s": best.get("turns_per_s"),
        "offered_msgs_per_s": best.get("offered_msgs_per_s"),
        "workers_pct_of_core": ours_w,
        "others_pct_of_core": ours_o,
        "worker_cpu_ms_per_turn": best.get("worker_cpu_ms_per_turn"),
        "ok": best.get("ok"),
        "cpu_sets_busy": busy,
    }
    if "workers" in busy and "others" in busy:
        # What other programs on the machine (not this bench's processes) ran on each set.
        out["foreign_pct_on_worker_cpus"] = round(max(0.0, busy["workers"]["busy_pct"] - ours_w), 1)
        out["foreign_pct_on_other_cpus"] = round(max(0.0, busy["others"]["busy_pct"] - ours_o), 1)
    return out


def _idle_share(run: dict[str, Any], workers: bool) -> float:
    """Cores the workers (or the other processes) use with nothing offered."""
    idle = run["idle_pct_of_core"]
    return sum(v for k, v in idle.items() if k.startswith("worker") == workers) / 100


def model_check(runs: list[dict[str, Any]], worker_cores: float, other_cores: float) -> dict[str, Any]:
    """The model's prediction for each N against the measurement, from the N=1 run only.

    Flat model: per-turn costs do not depend on N (the N=1 fixed-load figures), and the turns/s a
    deployment sustains = min(worker cores / worker CPU per turn, other cores / the other processes'
    CPU per turn). Idle model: each process also burns a fixed share of a core doing nothing (fetch
    loops, timers; measured with no load), so CPU = idle + turns * marginal cost, and N workers leave
    worker cores - N * idle for turns. Measured: the fixed-load costs for that N, the ramp's max
    (best passing step) and peak (most turns/s delivered by any step)."""
    base = runs[0]
    fixed1 = base["fixed"]
    turns1, wall1 = fixed1["turns"], fixed1["wall_s"]
    c_worker = fixed1["worker_cpu_ms_per_turn"]
    c_other = fixed1["infra_cpu_ms_per_turn"]["total"]
    idle_w = _idle_share(base, workers=True)  # one worker
    idle_o = _idle_share(base, workers=False)
    marginal_w = (fixed1["cpu_s"]["workers"] - idle_w * wall1) * 1000 / turns1 if turns1 else None
    other_s = sum(v for k, v in fixed1["cpu_s"].items() if k != "workers" and v is not None and not math.isnan(v))
    marginal_o = (other_s - idle_o * wall1) * 1000 / turns1 if turns1 else None
    rows = []
    for r in runs:
        n, fixed, ramp_result = r["workers"], r["fixed"], r["max"]
        flat = _bound(worker_cores * 1000, c_worker, other_cores * 1000, c_other)
        idle_model = _bound((worker_cores - n * idle_w) * 1000, marginal_w, (other_cores - idle_o) * 1000, marginal_o)
        peak = _peak(ramp_result.get("steps") or [])
        measured_max = ramp_result.get("max_turns_per_s")
        # The flat model again with the cores that were left after other programs took their share.
        available = (
            _bound(
                (worker_cores - peak["foreign_pct_on_worker_cpus"] / 100) * 1000,
                c_worker,
                (other_cores - peak["foreign_pct_on_other_cpus"] / 100) * 1000,
                c_other,
            )
            if "foreign_pct_on_worker_cpus" in peak
            else None
        )
        rows.append(
            {
                "workers": n,
                "worker_cpu_ms_per_turn": {
                    "flat": c_worker,
                    "idle_model": round(marginal_w + n * idle_w * wall1 * 1000 / turns1, 2)
                    if marginal_w is not None
                    else None,
                    "measured": fixed["worker_cpu_ms_per_turn"],
                },
                "other_cpu_ms_per_turn": {"flat": c_other, "measured": fixed["infra_cpu_ms_per_turn"]["total"]},
                "idle_pct_of_core": {
                    "workers": round(_idle_share(r, workers=True) * 100, 1),
                    "others": round(_idle_share(r, workers=False) * 100, 1),
                },
                "predicted_flat": flat,
                "predicted_idle_model": idle_model,
                "predicted_flat_on_cores_left": available,
                "measured_max_turns_per_s": measured_max,
                "measured_max_offered_msgs_per_s": ramp_result.get("max_offered_msgs_per_s"),
                "ceiling_found": ramp_result.get("ceiling_found"),
                "measured_peak": peak,
                "ratio_max_to_flat": _ratio(measured_max, flat["turns_per_s"]),
                "ratio_peak_to_flat": _ratio(peak.get("turns_per_s"), flat["turns_per_s"]),
                "ratio_peak_to_idle_model": _ratio(peak.get("turns_per_s"), idle_model["turns_per_s"]),
                "ratio_peak_to_flat_on_cores_left": _ratio(peak.get("turns_per_s"), available["turns_per_s"])
                if available
                else None,
            }
        )
    return {
        "worker_cores": worker_cores,
        "other_cores": other_cores,
        "marginal_worker_cpu_ms_per_turn": round(marginal_w, 2) if marginal_w is not None else None,
        "marginal_other_cpu_ms_per_turn": round(marginal_o, 2) if marginal_o is not None else None,
        "idle_one_worker_pct_of_core": round(idle_w * 100, 1),
        "idle_others_pct_of_core": round(idle_o * 100, 1),
        "rule": "flat: turns/s = min(worker cores * 1000 / worker CPU ms per turn, other cores * 1000 / other "
        "processes' CPU ms per turn) with the N=1 fixed-load costs; idle model: the same with each process's "
        "idle share of a core taken off its cores first and the marginal cost per turn",
        "rows": rows,
    }


def _bound(worker_ms: float, worker_cost: float | None, other_ms: float, other_cost: float | None) -> dict[str, Any]:
    """Turns/s the worker cores and the other cores each allow (ms of CPU per second ÷ ms per turn)."""
    w = worker_ms / worker_cost if worker_cost else None
    o = other_ms / other_cost if other_cost else None
    bounds = [v for v in (w, o) if v is not None]
    return {
        "turns_per_s": round(min(bounds), 1) if bounds else None,
        "worker_bound": round(w, 1) if w is not None else None,
        "other_bound": round(o, 1) if o is not None else None,
        "first_limit": None if not bounds else ("workers" if w is not None and w == min(bounds) else "others"),
    }


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    return round(measured / predicted, 2) if measured and predicted else None


def table(result: dict[str, Any]) -> str:
    """The run as Markdown: per-turn costs by N, then prediction vs measurement."""
    runs = result["runs"]
    lines = [
        "| N workers | turns/s at fixed load | worker CPU ms/turn (sum) | per worker: CPU ms/delivered, % core "
        "| broker / Redis / sim / bench ms/turn | Kafka records, bytes /turn "
        "| Redis cmds, round trips, bytes /turn | session calls /turn | idle % of a core: workers, others "
        "| filtered-only µs/msg: workers, others |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        f = r["fixed"]
        pw = ", ".join(f"{w['cpu_ms_per_delivered']} ({w['pct_of_core']}%)" for w in f["per_worker"].values())
        inf = f["infra_cpu_ms_per_turn"]
        calls = ", ".join(f"{k} {v}" for k, v in f["session_calls_per_turn"].items())
        fo = r["filtered_only"]
        fo_others = round(sum(fo["infra_cpu_us_per_msg"].values()), 1)
        lines.append(
            f"| {r['workers']} | {f['turns_per_s']} | {f['worker_cpu_ms_per_turn']} | {pw} "
            f"| {inf.get('broker')} / {inf.get('redis')} / {inf.get('sim')} / {inf.get('bench')} "
            f"| {f['kafka']['records_per_turn']}, {f['kafka']['record_bytes_per_turn']} "
            f"| {f['redis']['commands_per_turn']}, {f['redis']['round_trips_per_turn']}, "
            f"{f['redis']['net_bytes_per_turn']} | {calls} "
            f"| {_idle_share(r, True) * 100:.1f}, {_idle_share(r, False) * 100:.1f} "
            f"| {fo['worker_cpu_us_per_msg']}, {fo_others} |"
        )
    check = result["check"]
    lines += [
        "",
        f"Model ({check['rule']}): worker cores {check['worker_cores']}, other cores {check['other_cores']}; "
        f"N=1: marginal worker CPU {check['marginal_worker_cpu_ms_per_turn']} ms/turn, one idle worker "
        f"{check['idle_one_worker_pct_of_core']}% of a core, the others idle {check['idle_others_pct_of_core']}%, "
        f"their marginal CPU {check['marginal_other_cpu_ms_per_turn']} ms/turn.",
        "",
        "| N workers | worker CPU ms/turn at fixed load: flat / idle model / measured "
        "| predicted turns/s, flat (worker-, other-bound) | predicted, idle model (worker-, other-bound) "
        "| measured max turns/s (offered msg/s) | measured peak turns/s: workers / others % of a core "
        "| peak ÷ flat | peak ÷ idle model | other programs at the peak, % of the worker / other CPUs "
        "| flat on the cores they left (worker-, other-bound) | peak ÷ that |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in check["rows"]:
        pk, flat, idle, c = (
            row["measured_peak"],
            row["predicted_flat"],
            row["predicted_idle_model"],
            row["worker_cpu_ms_per_turn"],
        )
        left = row["predicted_flat_on_cores_left"] or {"turns_per_s": None, "worker_bound": None, "other_bound": None}
        lines.append(
            f"| {row['workers']} | {c['flat']} / {c['idle_model']} / {c['measured']} "
            f"| {flat['turns_per_s']} ({flat['worker_bound']}, {flat['other_bound']}) "
            f"| {idle['turns_per_s']} ({idle['worker_bound']}, {idle['other_bound']}) "
            f"| {row['measured_max_turns_per_s']} ({row['measured_max_offered_msgs_per_s']})"
            f"{'' if row['ceiling_found'] else ' no ceiling found'} "
            f"| {pk.get('turns_per_s')}: {pk.get('workers_pct_of_core')} / {pk.get('others_pct_of_core')} "
            f"| {row['ratio_peak_to_flat']} | {row['ratio_peak_to_idle_model']} "
            f"| {pk.get('foreign_pct_on_worker_cpus')} / {pk.get('foreign_pct_on_other_cpus')} "
            f"| {left['turns_per_s']} ({left['worker_bound']}, {left['other_bound']}) "
            f"| {row['ratio_peak_to_flat_on_cores_left']} |"
        )
    return "\n".join(lines) + "\n"


async def capacity_run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(c) for c in args.scale_workers.split(",") if c.strip()]
    workers = parse_cpus(args.pin_workers) if args.pin_workers else None
    others = parse_cpus(args.pin_others) if args.pin_others else None
    if others:
        # The bench process first: the broker, Redis and the simulator it starts inherit the set.
        pin_tree(os.getpid(), others)
    all_cores = float(os.cpu_count() or 1)
    worker_cores = float(len(workers)) if workers else all_cores
    other_cores = float(len(others)) if others else all_cores
    from pipeline.bench.main import mix_from

    mix = mix_from(args)
    runs = []
    for n in counts:
        where = f" on CPUs {sorted(workers)}, the rest on {sorted(others or [])}" if workers else ""
        log(f"capacity: {n} worker(s){where}")
        runs.append(await one_count(args, n, mix, workers, others))
    out: dict[str, Any] = {
        "pinning": {"workers": sorted(workers) if workers else None, "others": sorted(others) if others else None},
        "runs": runs,
        "check": model_check(runs, worker_cores, other_cores),
    }
    out["table"] = table(out)
    print(out["table"], flush=True)
    return out


def write_markdown(result: dict[str, Any], out_dir: Path, name: str) -> Path:
    m = result["machine"]
    head = (
        f"# {name}\n\nMachine: {m.get('cpu')} x{m.get('cores')}, commit {m.get('commit')}, load average "
        f"{m.get('loadavg_1_5_15_at_start')} → {m.get('loadavg_1_5_15_at_end')}. Pinning: "
        f"{result['capacity']['pinning']}.\n\n"
    )
    path = out_dir / f"{name}.md"
    path.write_text(head + result["capacity"]["table"])
    return path


__all__ = ["allowed_cpus", "capacity_run", "model_check", "parse_cpus", "pin_tree", "table", "write_markdown"]
