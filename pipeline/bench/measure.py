"""Process, Redis and Kafka meters for the benchmark (all read from outside the worker)."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int | None) -> float:
    """utime + stime of a process from /proc/<pid>/stat (NaN when it is gone)."""
    if not pid:
        return math.nan
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return math.nan


def thread_cpu_seconds(tid: int) -> float:
    """CPU of one thread of this process (/proc/self/task/<tid>/stat)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return math.nan


def self_cpu_seconds() -> float:
    return proc_cpu_seconds(os.getpid())


def rss_mib(pid: int | None) -> float:
    if not pid:
        return math.nan
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summary(values: list[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of a list (ms in, ms out); NaN-free JSON (None) when empty."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "p99": None, "max": None, "mean": None}  # type: ignore[dict-item]
    return {
        "n": len(values),
        "p50": round(pct(values, 50), 2),
        "p90": round(pct(values, 90), 2),
        "p99": round(pct(values, 99), 2),
        "max": round(max(values), 2),
        "mean": round(sum(values) / len(values), 2),
    }


@dataclass
class CpuMeter:
    """CPU seconds of a set of pids between start() and stop()."""

    pids: dict[str, int | None]
    start_values: dict[str, float] = field(default_factory=dict)
    t0: float = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.start_values = {name: proc_cpu_seconds(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float]:
        out = {name: proc_cpu_seconds(pid) - self.start_values[name] for name, pid in self.pids.items()}
        out["_wall"] = time.monotonic() - self.t0
        return out


async def redis_commands(redis: Any) -> int:
    info = await redis.info("stats")
    return int(info.get("total_commands_processed", 0))


async def redis_commandstats(redis: Any) -> dict[str, int]:
    info = await redis.info("commandstats")
    out: dict[str, int] = {}
    for name, value in info.items():
        if isinstance(value, dict) and "calls" in value:
            out[name.removeprefix("cmdstat_")] = int(value["calls"])
    return out


class KafkaWatermarks:
    """Sum of high watermarks over every non-internal topic (records written since the start)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self._consumer: Any = None
        self._admin: Any = None

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self._admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self._admin.start()
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False)
        await self._consumer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
        if self._admin is not None:
            await self._admin.close()

    async def by_topic(self, prefix_filter: tuple[str, ...] = ("im.", "session.")) -> dict[str, int]:
        out: dict[str, int] = {}
        for tp, high in (await self.by_partition(prefix_filter)).items():
            out[tp.topic] = out.get(tp.topic, 0) + high
        return out

    async def by_partition(self, prefix_filter: tuple[str, ...] = ("im.", "session.")) -> dict[Any, int]:
        """High watermark of every partition (keys are aiokafka `TopicPartition`s)."""
        from aiokafka import TopicPartition

        names = [t for t in await self._admin.list_topics() if t.startswith(prefix_filter)]
        tps = []
        for meta in await self._admin.describe_topics(names):
            if meta.get("error_code"):
                continue
            tps += [TopicPartition(meta["topic"], p["partition"]) for p in meta.get("partitions") or []]
        highs = await self._consumer.end_offsets(tps) if tps else {}
        return {tp: int(high) for tp, high in highs.items()}


async def kafka_record_bytes(
    bootstrap: str, start: dict[Any, int], end: dict[Any, int], *, timeout: float = 60.0
) -> dict[str, dict[str, int]]:
    """Records and their bytes (key + value + headers, as produced) written between two sets of
    high watermarks, by topic: read back after the phase, so the reading costs the phase nothing."""
    from aiokafka import AIOKafkaConsumer

    ranges = {tp: (start.get(tp, 0), high) for tp, high in end.items() if high > start.get(tp, 0)}
    out: dict[str, dict[str, int]] = {}
    if not ranges:
        return out
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign(list(ranges))
        for tp, (first, _) in ranges.items():
            consumer.seek(tp, first)
        pending = set(ranges)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=500, max_records=5000)
            for tp, records in batches.items():
                last = ranges[tp][1]
                row = out.setdefault(tp.topic, {"records": 0, "bytes": 0})
                for rec in records:
                    if rec.offset >= last:
                        break
                    row["records"] += 1
                    row["bytes"] += (rec.serialized_key_size if rec.key is not None else 0) + max(
                        rec.serialized_value_size, 0
                    )
                    row["bytes"] += sum(len(k) + len(v or b"") for k, v in rec.headers or ())
            for tp in list(pending):
                if await consumer.position(tp) >= ranges[tp][1]:
                    pending.discard(tp)
    finally:
        await consumer.stop()
    return out


async def redis_net_bytes(redis: Any) -> int:
    """Bytes Redis received and sent (`INFO stats` total_net_input_bytes + total_net_output_bytes)."""
    info = await redis.info("stats")
    return int(info.get("total_net_input_bytes", 0)) + int(info.get("total_net_output_bytes", 0))


#: Built once: a new httpx client otherwise loads the CA bundle into a context of its own (~10 ms of
#: CPU, ~40 ms on a busy machine), a cost paid per scrape or poll by short-lived clients.
TLS = httpx.create_ssl_context()


async def scrape_metrics(url: str, client: httpx.AsyncClient | None = None) -> dict[str, float]:
    """Prometheus text → {'name{labels}': value} (only what the bench reads)."""
    own = client is None
    client = client or httpx.AsyncClient(timeout=5, verify=TLS)
    try:
        text = (await client.get(url + "/metrics")).text
    except httpx.HTTPError:
        return {}
    finally:
        if own:
            await client.aclose()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


async def wait_idle(worker_urls: Callable[[], list[str]], *, quiet: float = 0.5, timeout: float = 60.0) -> float:
    """Wait until every worker reports nothing in flight (`switchboard_worker_idle` 1) for `quiet`
    seconds on end; return the seconds waited. `worker_urls` is asked on every poll, so a worker
    restarted meanwhile is followed. Raises TimeoutError if the workers are not idle in time."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    idle_since: float | None = None
    async with httpx.AsyncClient(timeout=5, verify=TLS) as client:
        while True:
            now = loop.time()
            urls = worker_urls()
            idle = bool(urls)
            for url in urls:
                scraped = await scrape_metrics(url, client)
                idle = idle and metric_sum(scraped, "switchboard_worker_idle") == 1.0
            if not idle:
                idle_since = None
            elif idle_since is None:
                idle_since = now
            elif now - idle_since >= quiet:
                return now - start
            if now - start > timeout:
                raise TimeoutError(f"workers not idle for {quiet} s within {timeout} s: {urls}")
            await asyncio.sleep(0.1)


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    total = 0.0
    for key, value in metrics.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


class ThreadCpu:
    """CPU of the calling thread, for a generator running in its own thread."""

    def __init__(self) -> None:
        self.tid = threading.get_native_id()

    def seconds(self) -> float:
        return thread_cpu_seconds(self.tid)


async def profile_worker(pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """py-spy record -f raw: top frames by own samples and by inclusive samples."""
    await asyncio.to_thread(out.parent.mkdir, parents=True, exist_ok=True)
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        proc = await asyncio.create_subprocess_exec(
            exe,
            "record",
            "-p",
            str(pid),
            "-f",
            "raw",
            "-o",
            str(out),
            "-d",
            str(int(seconds)),
            "-r",
            "100",
            "--nonblocking",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return {"error": f"py-spy: {exc}"}
    _, err = await proc.communicate()
    text = await asyncio.to_thread(lambda: out.read_text() if out.exists() else "")
    if proc.returncode != 0 or not text:
        return {"error": (err or b"").decode()[-500:]}
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        try:
            n = int(count)
        except ValueError:
            continue
        frames = stack.split(";")
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def top(counter: Counter[str], k: int) -> list[dict[str, Any]]:
        return [{"frame": f, "pct": round(c * 100 / max(total, 1), 1)} for f, c in counter.most_common(k)]

    return {"samples": total, "file": str(out), "top_self": top(own, 25), "top_inclusive": top(inclusive, 40)}


def cpu_jiffies() -> dict[int, tuple[int, int]]:
    """Per CPU from /proc/stat: (busy, steal) clock ticks since boot; busy = user + nice + system +
    irq + softirq, whoever ran (steal: the hypervisor gave the time to another guest)."""
    out: dict[int, tuple[int, int]] = {}
    try:
        with open("/proc/stat") as f:
            for line in f:
                name, _, rest = line.partition(" ")
                if not name.startswith("cpu") or name == "cpu":
                    continue
                v = [int(x) for x in rest.split()]
                out[int(name[3:])] = (v[0] + v[1] + v[2] + v[5] + v[6], v[7] if len(v) > 7 else 0)
    except (OSError, ValueError, IndexError):
        pass
    return out


class CpuSetMeter:
    """How busy each named CPU set was between start() and stop(), by anyone, in % of one core."""

    def __init__(self, sets: dict[str, set[int]]) -> None:
        self.sets = sets
        self._t0 = 0.0
        self._j0: dict[int, tuple[int, int]] = {}

    def start(self) -> None:
        self._t0, self._j0 = time.monotonic(), cpu_jiffies()

    def stop(self) -> dict[str, dict[str, float]]:
        wall = max(time.monotonic() - self._t0, 1e-6)
        now = cpu_jiffies()
        out = {}
        for name, cpus in self.sets.items():
            busy = sum(now[c][0] - self._j0[c][0] for c in cpus if c in now and c in self._j0)
            steal = sum(now[c][1] - self._j0[c][1] for c in cpus if c in now and c in self._j0)
            out[name] = {
                "busy_pct": round(busy / CLK_TCK / wall * 100, 1),
                "steal_pct": round(steal / CLK_TCK / wall * 100, 1),
            }
        return out
