"""`switchboard bench --soak`: steady load for an hour (or `--duration`), measured per window.

The traffic is the load phase's (`build_plan`, the default profile) at one steady rate, fired by
the same open-loop generator, but planned lazily in chunks of `CHUNK_S` seconds and read back as
it is delivered (the console's live channel), so the bench holds at most a window or two of
messages and replies whatever the duration: its own memory stays flat. Each chunk's message ids
carry their window (`<run>w<window>c<chunk>-<n>`), so a reply is counted in the window its message
was sent in. Per window: the load phase's latency figures (`latency_report`) over the replies to
the messages sent in it, the RSS and CPU of every process at its end, Redis memory and keys; at the
end, each RSS's slope per 10,000 messages and the verdicts against the long-run targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pipeline.bench.load import Delivery, Generator, Plan, Sent, TrafficMix, build_plan, latency_report, parse_delivery
from pipeline.bench.measure import proc_cpu_seconds, rss_mib
from pipeline.bench.report import write_json
from pipeline.bench.runner import BenchStack, LiveTap, attach_stack, log, start_stack, warm_up
from pipeline.state import LiveMessage

#: Messages are planned this many seconds at a time (a few ms of the generator's thread each).
CHUNK_S = 10.0
#: A reply is counted in its window if it arrives at most this long after the window's end;
#: later ones are counted as `replies_after_close` (and fail the p99 target: they are that slow).
GRACE_MAX_S = 60.0
#: The long-run targets: after the warm-up, worker RSS within +5%; Redis bounded; every window's
#: overhead p99 within 1.5x the first post-warm-up window's.
RSS_GROWTH_LIMIT_PCT = 5.0
REDIS_GROWTH_LIMIT_PCT = 5.0
#: Keys without an expiry may grow this many over the run before they count as unbounded (a few
#: per-deployment keys appear lazily).
REDIS_PERSISTENT_KEYS_SLACK = 10
P99_RATIO_LIMIT = 1.5
SLOPE_PER_MESSAGES = 10_000

_MSG_WINDOW_RE = re.compile(r"w(\d+)c\d+-\d+$")


# ---------------------------------------------------------------------------- pure parts


def window_bounds(duration: float, window: float) -> list[tuple[float, float]]:
    """[start, end) seconds of every window; the last one is shorter when `window` does not divide
    `duration`."""
    if duration <= 0 or window <= 0:
        raise ValueError("duration and window must be positive")
    count = max(1, math.ceil(duration / window - 1e-9))
    return [(k * window, min((k + 1) * window, duration)) for k in range(count)]


def chunk_schedule(
    bounds: Sequence[tuple[float, float]], chunk: float = CHUNK_S
) -> list[tuple[int, int, float, float]]:
    """(window, chunk, start s, length s) of every planned chunk: chunks never straddle windows."""
    out = []
    for k, (start, end) in enumerate(bounds):
        j, at = 0, start
        while at < end - 1e-9:
            length = min(chunk, end - at)
            out.append((k, j, at, length))
            j, at = j + 1, at + length
    return out


def chunk_run_id(base: str, window: int, chunk: int) -> str:
    """The run id of one chunk's plan: its message ids are `<this>-<n>`."""
    return f"{base}w{window}c{chunk}"


def window_of(msg_id: str | None) -> int | None:
    """The window a soak message was sent in, from its id; None for any other id (warm-up)."""
    match = _MSG_WINDOW_RE.search(msg_id or "")
    return int(match.group(1)) if match else None


def post_warmup(windows: Sequence[dict[str, Any]], warmup: float) -> list[dict[str, Any]]:
    """The windows that start at or after the warm-up's end."""
    return [w for w in windows if w["start_s"] >= warmup - 1e-9]


def slope(points: Sequence[tuple[float, float | None]]) -> float | None:
    """Least-squares slope of y over x (None/NaN points left out); None with fewer than two
    distinct x."""
    pts = [(x, y) for x, y in points if y is not None and not math.isnan(y) and not math.isnan(x)]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def _growth_pct(base: float | None, values: Sequence[float | None]) -> float | None:
    seen = [v for v in values if v is not None and not math.isnan(v)]
    if base is None or math.isnan(base) or base <= 0 or not seen:
        return None
    return round((max(seen) / base - 1) * 100, 2)


def _baseline(start: dict[str, Any], windows: Sequence[dict[str, Any]], warmup: float) -> dict[str, Any]:
    """The sample at the warm-up's end: the end of the last warm-up window, or the start."""
    before = [w for w in windows if w["start_s"] < warmup - 1e-9]
    return before[-1] if before else start


def verdicts(start: dict[str, Any], windows: Sequence[dict[str, Any]], warmup: float) -> dict[str, Any]:
    """Slopes and the targets over the windows after the warm-up. `start` and every window carry
    `messages_total` (inbound messages accepted so far), `rss_mib` {process: MiB} and `redis`
    {used_memory_mib, keys, keys_with_expiry} as sampled at their end (`start`: before the load);
    windows also `latency_ms.pipeline_overhead.p99` and `replies_after_close`."""
    post = post_warmup(windows, warmup)
    out: dict[str, Any] = {"warmup_s": warmup, "post_warmup_windows": len(post)}
    if not post:
        out.update({"ok": None, "why": "no window after the warm-up: nothing to judge"})
        return out
    base = _baseline(start, windows, warmup)
    series = [base, *post]
    procs = sorted({name for s in series for name in s["rss_mib"]})
    out["rss_slope_mib_per_10k_msgs"] = {
        name: _round(slope([(s["messages_total"], s["rss_mib"].get(name)) for s in series]), SLOPE_PER_MESSAGES)
        for name in procs
    }
    workers = [n for n in procs if n.startswith("worker")]
    rss: dict[str, Any] = {"limit_pct": RSS_GROWTH_LIMIT_PCT, "by_worker": {}}
    for name in workers:
        growth = _growth_pct(base["rss_mib"].get(name), [s["rss_mib"].get(name) for s in post])
        rss["by_worker"][name] = {
            "at_warmup_end_mib": base["rss_mib"].get(name),
            "max_mib": max((s["rss_mib"].get(name) or 0.0 for s in post), default=None),
            "growth_pct": growth,
        }
    growths = [w["growth_pct"] for w in rss["by_worker"].values()]
    rss["ok"] = bool(growths) and all(g is not None and g <= RSS_GROWTH_LIMIT_PCT for g in growths)
    out["worker_rss"] = rss

    def redis_field(s: dict[str, Any], key: str) -> float | None:
        value = (s.get("redis") or {}).get(key)
        return float(value) if value is not None else None

    def persistent(s: dict[str, Any]) -> float | None:
        keys, expiring = redis_field(s, "keys"), redis_field(s, "keys_with_expiry")
        return keys - expiring if keys is not None and expiring is not None else None

    persistent_base = persistent(base)
    persistent_max = max((p for p in (persistent(s) for s in post) if p is not None), default=None)
    keys_ok = (
        persistent_base is not None
        and persistent_max is not None
        and persistent_max <= persistent_base * (1 + REDIS_GROWTH_LIMIT_PCT / 100) + REDIS_PERSISTENT_KEYS_SLACK
    )
    memory_growth = _growth_pct(redis_field(base, "used_memory_mib"), [redis_field(s, "used_memory_mib") for s in post])
    out["redis"] = {
        "used_memory_slope_mib_per_10k_msgs": _round(
            slope([(s["messages_total"], redis_field(s, "used_memory_mib")) for s in series]), SLOPE_PER_MESSAGES
        ),
        "keys_slope_per_10k_msgs": _round(
            slope([(s["messages_total"], redis_field(s, "keys")) for s in series]), SLOPE_PER_MESSAGES
        ),
        "used_memory_growth_pct": memory_growth,
        "used_memory_limit_pct": REDIS_GROWTH_LIMIT_PCT,
        "memory_ok": memory_growth is not None and memory_growth <= REDIS_GROWTH_LIMIT_PCT,
        "keys_without_expiry_at_warmup_end": persistent_base,
        "keys_without_expiry_max": persistent_max,
        "keys_ok": keys_ok,
    }
    out["redis"]["ok"] = out["redis"]["memory_ok"] and keys_ok

    p99s = [((w["latency_ms"]["pipeline_overhead"] or {}).get("p99")) for w in post]
    first = p99s[0]
    ratios = [round(p / first, 2) if p is not None and first else None for p in p99s]
    late = sum(w.get("replies_after_close", 0) for w in post)
    over = [w["window"] for w, r in zip(post, ratios, strict=True) if r is None or r > P99_RATIO_LIMIT]
    out["overhead_p99"] = {
        "first_window_ms": first,
        "max_ms": max((p for p in p99s if p is not None), default=None),
        "ratio_by_window": ratios,
        "max_ratio": max((r for r in ratios if r is not None), default=None),
        "limit_ratio": P99_RATIO_LIMIT,
        # A window without a reply (a stall) or with replies too late to be counted fails too.
        "windows_over": over,
        "replies_after_close": late,
        "ok": first is not None and not over and late == 0,
    }
    out["ok"] = bool(rss["ok"] and out["redis"]["ok"] and out["overhead_p99"]["ok"])
    return out


def _round(value: float | None, scale: float = 1.0, digits: int = 3) -> float | None:
    return None if value is None else round(value * scale, digits)


# ---------------------------------------------------------------------------- traffic and replies


class SoakSchedule:
    """The soak's messages, planned a chunk at a time as the generator's thread reads them. The
    messages of each window are kept (for the client-side latency and the ack times) until the
    window is taken."""

    def __init__(self, mix: TrafficMix, rate: float, bounds: Sequence[tuple[float, float]], base: str) -> None:
        self.mix = mix
        self.rate = rate
        self.chunks = chunk_schedule(bounds)
        self.base = base
        self._sent: dict[int, dict[str, Sent]] = {}
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[tuple[Sent, float]]:
        for window, chunk, start, length in self.chunks:
            run_id = chunk_run_id(self.base, window, chunk)
            plan = build_plan(self.mix, self.rate, length, seed=window * 100_000 + chunk + 1, run_id=run_id)
            with self._lock:
                self._sent.setdefault(window, {}).update((s.msg_id, s) for s in plan.messages)
            for sent, offset in zip(plan.messages, plan.offsets, strict=True):
                yield sent, start + offset

    def take(self, window: int) -> dict[str, Sent]:
        """The window's messages, forgotten here."""
        with self._lock:
            return self._sent.pop(window, {})


@dataclass
class WindowedReplies:
    """Deliveries grouped by the window their message was sent in, until the window is closed."""

    open: dict[int, list[Delivery]] = field(default_factory=dict)
    closed: set[int] = field(default_factory=set)
    after_close: dict[int, int] = field(default_factory=dict)
    other: int = 0  # deliveries to messages that are not the soak's (the warm-up's)
    count: int = 0

    def add(self, delivery: Delivery) -> None:
        self.count += 1
        window = window_of(delivery.reply_to)
        if window is None:
            self.other += 1
        elif window in self.closed:
            self.after_close[window] = self.after_close.get(window, 0) + 1
        else:
            self.open.setdefault(window, []).append(delivery)

    def close(self, window: int) -> list[Delivery]:
        self.closed.add(window)
        return self.open.pop(window, [])


class ReplyTap(LiveTap):
    """Reads every console delivery of one bot off the live channel into a `WindowedReplies`
    (`resubscribed`: times the channel's connection broke, so replies may be missing)."""

    def __init__(self, bs: BenchStack, bot: str) -> None:
        super().__init__(bs, bot)
        self.replies = WindowedReplies()
        self.last_at = time.monotonic()

    def on_message(self, data: Any) -> None:
        try:
            live = LiveMessage.parse(data)
        except (ValueError, TypeError):
            return
        if live.bot_id != self.bot or live.seq == 0:  # seq 0: a status note, not a delivery
            return
        self.replies.add(parse_delivery(live.chat_id, live.message, keep_text=False))
        self.last_at = time.monotonic()


# ---------------------------------------------------------------------------- measuring


async def redis_figures(redis: Any) -> dict[str, Any]:
    """used_memory (INFO memory), the key count (DBSIZE) and how many keys carry an expiry (INFO
    keyspace, every database)."""
    memory = await redis.info("memory")
    keyspace = await redis.info("keyspace")
    expiring = sum(int(db.get("expires", 0)) for db in keyspace.values() if isinstance(db, dict))
    return {
        "used_memory_mib": round(int(memory.get("used_memory", 0)) / 2**20, 2),
        "keys": int(await redis.dbsize()),
        "keys_with_expiry": expiring,
    }


async def take_sample(bs: BenchStack, http: httpx.AsyncClient, accepted: int) -> dict[str, Any]:
    """Every process's RSS and CPU (the bench itself as `bench`), Redis, the workers' counters."""
    pids: dict[str, int | None] = {**bs.pids(), "bench": os.getpid()}
    counters = await bs.counters(http)
    return {
        "at": time.monotonic(),
        "messages_total": accepted,
        "rss_mib": {name: round(rss_mib(pid), 1) for name, pid in pids.items() if pid},
        "cpu_s": {name: proc_cpu_seconds(pid) for name, pid in pids.items() if pid},
        "redis": await redis_figures(bs.redis) if bs.redis is not None else None,
        "ingested": counters["ingested"],
        "loop_stalls": counters["loop_stalls"],
    }


def window_record(
    index: int,
    bounds: tuple[float, float],
    warmup: float,
    sent: dict[str, Sent],
    deliveries: Sequence[Delivery],
    before: dict[str, Any],
    after: dict[str, Any],
) -> dict[str, Any]:
    """One window's figures: latency over the replies to the messages sent in it; CPU, ingest and
    stalls between the samples at its start and end; RSS and Redis at its end."""
    replies = [d for d in deliveries if d.kind == "reply"]
    lat = latency_report(deliveries, sent)
    cpu = {
        name: round(after["cpu_s"][name] - before["cpu_s"][name], 2)
        for name in after["cpu_s"]
        if name in before["cpu_s"] and not math.isnan(after["cpu_s"][name] - before["cpu_s"][name])
    }
    worker_cpu = sum(v for name, v in cpu.items() if name.startswith("worker"))
    wall = max(after["at"] - before["at"], 1e-6)
    stalls = after["loop_stalls"] - before["loop_stalls"]
    return {
        "window": index,
        "start_s": bounds[0],
        "end_s": bounds[1],
        "warmup": bounds[0] < warmup - 1e-9,
        "messages": {
            "sent": sum(1 for s in sent.values() if s.attempts),
            "accepted": sum(1 for s in sent.values() if s.acked_ms),
            "triggering": sum(1 for s in sent.values() if s.triggers),
            "ingested": int(after["ingested"] - before["ingested"]),
        },
        "messages_total": after["messages_total"],
        "replies": len(replies),
        "notices": len(deliveries) - len(replies),
        "replies_after_close": 0,  # filled in as late replies arrive
        "latency_ms": {
            "end_to_end": lat.end_to_end,
            "pipeline_overhead": lat.overhead,
            "pipeline_overhead_excluding_busy_wait": lat.overhead_excluding_busy_wait,
            "client_end_to_end": lat.client_end_to_end,
            "ingress_ack": lat.ingress_ack,
        },
        "rss_mib": after["rss_mib"],
        "cpu_s": cpu,
        "worker_cpu_ms_per_turn": round(worker_cpu * 1000 / len(replies), 3) if replies else None,
        "worker_cpu_pct": round(worker_cpu / wall * 100, 1),
        "worker_loop_stalls": None if math.isnan(stalls) else int(stalls),
        "redis": after["redis"],
    }


def window_line(label: str, w: dict[str, Any]) -> str:
    lat = w["latency_ms"]

    def ms(s: dict[str, Any], q: str) -> str:
        return "-" if s.get(q) is None else f"{s[q]:.0f}"

    rss = " ".join(f"{name} {mib:.0f}" for name, mib in w["rss_mib"].items())
    redis = w["redis"] or {}
    return (
        f"soak {label} w{w['window']:02d} [{w['start_s']:.0f}-{w['end_s']:.0f}s{' warm-up' if w['warmup'] else ''}] "
        f"sent {w['messages']['sent']} replies {w['replies']} | e2e p50/p99 {ms(lat['end_to_end'], 'p50')}/"
        f"{ms(lat['end_to_end'], 'p99')} ms overhead {ms(lat['pipeline_overhead'], 'p50')}/"
        f"{ms(lat['pipeline_overhead'], 'p99')} ms | RSS MiB {rss} | worker {w['worker_cpu_ms_per_turn']} ms/turn "
        f"{w['worker_cpu_pct']}% | Redis {redis.get('used_memory_mib')} MiB {redis.get('keys')} keys"
    )


# ---------------------------------------------------------------------------- the run


async def soak_on(bs: BenchStack, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """Warm up, then the soak on one stack; returns its windows, slopes and verdicts."""
    from pipeline.bench.main import mix_from

    mix = mix_from(args)
    log(f"warm-up: {mix.conversations} conversations")
    await warm_up(bs, mix)
    bounds = window_bounds(args.duration, args.window)
    schedule = SoakSchedule(mix, args.rate, bounds, uuid.uuid4().hex[:6])
    tap = ReplyTap(bs, mix.bot)
    await tap.start()
    http = httpx.AsyncClient(timeout=5)
    gen = Generator(Plan([], [], [], mix.bot, schedule.base), bs.urls, schedule=schedule)
    grace = min(args.window, GRACE_MAX_S)
    quiet = max(3.0, 3 * (mix.think or 0.0))
    windows: list[dict[str, Any]] = []
    try:
        samples = [await take_sample(bs, http, 0)]
        log(
            f"soak {label}: {len(bounds)} window(s) of {args.window:g} s at {args.rate:g} msg/s, "
            f"warm-up {args.warmup:g} s; a window's line follows up to {grace:g} s after its end"
        )
        t0 = time.monotonic()
        gen.start()
        while len(windows) < len(bounds):
            # Wake on a window's end, so its sample is taken then (not up to a tick into the next).
            next_end = bounds[len(samples) - 1][1] if len(samples) <= len(bounds) else math.inf
            await asyncio.sleep(max(0.0, min(0.5, next_end - (time.monotonic() - t0))))
            now = time.monotonic() - t0
            while len(samples) <= len(bounds) and now >= bounds[len(samples) - 1][1]:
                samples.append(await take_sample(bs, http, gen.stats.acked))
            drained = False
            if len(samples) > len(bounds) and gen.stats.done and time.monotonic() - tap.last_at >= quiet:
                ingested = (await bs.counters(http))["ingested"] - samples[0]["ingested"]
                drained = ingested >= gen.stats.acked
            while len(windows) < len(samples) - 1:
                k = len(windows)
                last = k == len(bounds) - 1
                if not (now >= bounds[k][1] + grace or (last and drained)):
                    break
                record = window_record(
                    k, bounds[k], args.warmup, schedule.take(k), tap.replies.close(k), samples[k], samples[k + 1]
                )
                windows.append(record)
                log(window_line(label, record))
    finally:
        gen.stop()
        await gen.wait()
        await tap.stop()
        await http.aclose()
    for k, late in tap.replies.after_close.items():
        windows[k]["replies_after_close"] = late
    start = {key: samples[0][key] for key in ("messages_total", "rss_mib", "redis")}
    verdict = verdicts(start, windows, args.warmup)
    stats = gen.stats
    return {
        "broker": label,
        "rate_msgs_per_s": args.rate,
        "duration_s": args.duration,
        "window_s": args.window,
        "warmup_s": args.warmup,
        "grace_s": grace,
        "messages": {"sent": stats.sent, "accepted": stats.acked, "failed": stats.failed, "http_errors": stats.errors},
        "generator_behind_max_ms": round(stats.behind_max_ms, 1),
        "reply_channel_resubscribed": tap.resubscribed,
        "start": start,
        "windows": windows,
        "targets": verdict,
        "ok": verdict["ok"],
    }


def summary_lines(label: str, soak: dict[str, Any]) -> list[str]:
    t = soak["targets"]
    if t["ok"] is None:
        return [f"soak {label}: {t['why']}"]

    def mark(ok: bool) -> str:
        return "ok" if ok else "MISSED"

    rss = t["worker_rss"]
    redis = t["redis"]
    p99 = t["overhead_p99"]
    growth = ", ".join(f"{n} {w['growth_pct']}%" for n, w in rss["by_worker"].items())
    slopes = ", ".join(f"{n} {v}" for n, v in t["rss_slope_mib_per_10k_msgs"].items())
    return [
        f"soak {label}: after {t['warmup_s']:g} s of warm-up, {t['post_warmup_windows']} window(s):",
        f"  worker RSS growth {growth} (target ≤ +{rss['limit_pct']:g}%): {mark(rss['ok'])}",
        f"  RSS slope MiB per 10,000 messages: {slopes}",
        f"  Redis used_memory {redis['used_memory_growth_pct']}% "
        f"({redis['used_memory_slope_mib_per_10k_msgs']} MiB per 10k msgs; "
        f"target ≤ +{redis['used_memory_limit_pct']:g}%): {mark(redis['memory_ok'])}",
        f"  Redis keys {redis['keys_slope_per_10k_msgs']} per 10k msgs; without expiry "
        f"{redis['keys_without_expiry_at_warmup_end']} → max {redis['keys_without_expiry_max']}: "
        f"{mark(redis['keys_ok'])}",
        f"  overhead p99 first {p99['first_window_ms']} ms, max {p99['max_ms']} ms, max ratio {p99['max_ratio']} "
        f"(target ≤ {p99['limit_ratio']:g}x; windows over {p99['windows_over']}, replies after close "
        f"{p99['replies_after_close']}): {mark(p99['ok'])}",
        f"soak {label}: {'every target met' if t['ok'] else 'targets MISSED'}",
    ]


async def soak_run(args: argparse.Namespace, result: dict[str, Any], out_dir: Path, name: str) -> dict[str, Any]:
    """`--soak`: the soak on each broker in turn (or on an attached stack); JSON and chart."""
    result["soak"] = {}
    if args.attach:
        bs = await attach_stack(args.attach, args.worker_pid)
        try:
            result["soak"]["attached"] = await soak_on(bs, args, "attached")
        finally:
            await bs.close()
    else:
        for broker in ["tansu", "kafka"] if args.broker == "both" else [args.broker]:
            log(f"starting the stack on {broker} ({args.workers} worker(s), think {args.think}s)")
            bs = await start_stack(
                broker=broker,
                workers=args.workers,
                think=args.think,
                run_dir=(args.run_dir / broker) if args.run_dir else None,
                partitions=args.partitions,
                log_level=args.log_level,
                extra_env=dict(kv.split("=", 1) for kv in args.env),
            )
            log(f"stack up: run dir {bs.run_dir}")
            try:
                result["soak"][broker] = await soak_on(bs, args, broker)
            finally:
                await bs.close()
    result["headline"] = {label: soak_headline(soak) for label, soak in result["soak"].items()}
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    result["machine"]["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["ok"] = all(s["ok"] is not False for s in result["soak"].values())
    json_path = write_json(result, out_dir, name)
    png_path = None
    with contextlib.suppress(Exception):
        png_path = await asyncio.to_thread(write_soak_chart, result, out_dir, name)
    for label, soak in result["soak"].items():
        for line in summary_lines(label, soak):
            print(line, flush=True)
    log(f"result: {json_path}" + (f", chart: {png_path}" if png_path else ""))
    result["_paths"] = (str(json_path), str(png_path) if png_path else None)
    return result


def soak_headline(soak: dict[str, Any]) -> dict[str, Any]:
    t = soak["targets"]
    if t["ok"] is None:
        return {"ok": None}
    return {
        "worker_rss_growth_pct": {n: w["growth_pct"] for n, w in t["worker_rss"]["by_worker"].items()},
        "rss_slope_mib_per_10k_msgs": t["rss_slope_mib_per_10k_msgs"],
        "redis_used_memory_growth_pct": t["redis"]["used_memory_growth_pct"],
        "redis_keys_slope_per_10k_msgs": t["redis"]["keys_slope_per_10k_msgs"],
        "overhead_p99_first_ms": t["overhead_p99"]["first_window_ms"],
        "overhead_p99_max_ratio": t["overhead_p99"]["max_ratio"],
        "ok": t["ok"],
    }


def write_soak_chart(result: dict[str, Any], out_dir: Path, name: str) -> Path:
    """RSS of every process and the p99s per window (by window end, minutes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig, (ax_rss, ax_p99) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=72)
    for label, soak in result["soak"].items():
        windows = soak["windows"]
        t = [w["end_s"] / 60 for w in windows]
        samples = [soak["start"], *windows]  # RSS from before the load on
        for proc in sorted({p for w in samples for p in w["rss_mib"]}):
            ax_rss.plot([0.0, *t], [w["rss_mib"].get(proc) for w in samples], marker=".", lw=1, label=f"{label} {proc}")
        for key, style in (("pipeline_overhead", "-"), ("end_to_end", ":")):
            ax_p99.plot(
                t,
                [w["latency_ms"][key].get("p99") for w in windows],
                style,
                marker=".",
                lw=1,
                label=f"{label} {key.replace('_', ' ')} p99",
            )
        ax_rss.axvline(soak["warmup_s"] / 60, color="grey", lw=0.5)
        ax_p99.axvline(soak["warmup_s"] / 60, color="grey", lw=0.5)
    ax_rss.set_title("RSS per process (MiB), at each window's end", fontsize=9)
    ax_p99.set_title("reply latency p99 (ms), by window sent", fontsize=9)
    ax_p99.set_yscale("log")
    for ax in (ax_rss, ax_p99):
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6)
    fig.suptitle(f"switchboard bench --soak — {result['name']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path
