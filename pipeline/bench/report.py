"""JSON result and a small PNG chart in bench/results/."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    commit = ""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=RESULTS.parents[1], timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import os

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": mem_gib,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "commit": commit,
        # Other work on the machine competes for the same cores: the load before the run.
        "loadavg_1_5_15_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(result: dict[str, Any], out_dir: Path, name: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(_clean(result), indent=2, ensure_ascii=False) + "\n")
    return path


def write_chart(result: dict[str, Any], series: list[tuple[float, float, float]], out_dir: Path, name: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.png"
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), dpi=72)
    main = result.get("load", {})
    timeline = main.get("timeline", [])
    ax = axes[0][0]
    if timeline:
        t = [r["t"] for r in timeline]
        ax.plot(t, [r["sent_per_s"] for r in timeline], label="sent msg/s", lw=1)
        ax.plot(t, [r["ingested_per_s"] for r in timeline], label="ingested msg/s", lw=1)
        ax.plot(t, [r["delivered_per_s"] for r in timeline], label="replies/s", lw=1)
        ax2 = ax.twinx()
        ax2.plot(t, [r["worker_cpu_pct"] for r in timeline], "k:", label="worker CPU %", lw=1)
        ax2.set_ylabel("worker CPU %", fontsize=8)
        ax2.tick_params(labelsize=7)
    streams = result.get("streams", {}).get("timeline", [])
    if not timeline and streams:
        ax.plot([r["t"] for r in streams], [r["streams"] for r in streams], label="SSE streams held")
        ax2 = ax.twinx()
        ax2.plot([r["t"] for r in streams], [r["rss_mib"] for r in streams], "k:", label="worker RSS MiB")
        ax2.set_ylabel("worker RSS MiB", fontsize=8)
        ax2.tick_params(labelsize=7)
    ax.set_title("load (open loop)" if timeline else "turns in flight (streams)", fontsize=9)
    ax.set_xlabel("s", fontsize=8)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="upper left")
    ax.tick_params(labelsize=7)

    ax = axes[0][1]
    if series:
        ax.scatter([s[0] for s in series], [s[1] for s in series], s=2, label="end to end", alpha=0.5)
        ax.scatter([s[0] for s in series], [s[2] for s in series], s=2, label="pipeline overhead", alpha=0.5)
        ax.set_yscale("log")
    ax.set_title("reply latency (ms)", fontsize=9)
    ax.set_xlabel("s", fontsize=8)
    if series:
        ax.legend(fontsize=7, markerscale=4)
    ax.tick_params(labelsize=7)

    ax = axes[1][0]
    stages = main.get("latency_ms", {}).get("stages", {})
    names = [k for k, v in stages.items() if v.get("n")]
    if names:
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [stages[n]["p50"] for n in names], width=0.4, label="p50")
        ax.bar([i + 0.2 for i in x], [stages[n]["p99"] for n in names], width=0.4, label="p99")
        ax.set_xticks(list(x))
        ax.set_xticklabels([n.replace("->", "→\n") for n in names], fontsize=6)
        ax.set_yscale("log")
    ax.set_title("per-stage latency (ms)", fontsize=9)
    if names:
        ax.legend(fontsize=7)
    ax.tick_params(labelsize=7)

    ax = axes[1][1]
    bars: list[tuple[str, float]] = []
    tp = main.get("throughput", {})
    if tp:
        bars.append(("pipeline\nturns/s", tp.get("turns_per_s") or 0))
    lim = result.get("limit", {})
    if lim.get("limit_turns_per_s"):
        bars.append(("bare chain\nturns/s", lim["limit_turns_per_s"]))
    bare = result.get("bare_turn", {})
    for key, label in (("bare_turn_turns_per_s", "bare turn"), ("bare_turn_max_turns_per_s", "bare turn max")):
        if bare.get(key):
            bars.append((f"{label}\nturns/s", bare[key]))
    for key, label in (("max_1_worker", "max 1w"), ("max_2_workers", "max 2w")):
        s = result.get("scale", {}).get(key)
        if s and s.get("max_turns_per_s"):
            bars.append((f"{label}\nturns/s", s["max_turns_per_s"]))
    ramp = result.get("max", {})
    if ramp.get("max_turns_per_s"):
        bars.append(("ramp max\nturns/s", ramp["max_turns_per_s"]))
    cmp_ = result.get("broker_comparison", {})
    for broker, data in cmp_.items():
        if isinstance(data, dict) and data.get("turns_per_s"):
            bars.append((f"{broker}\nturns/s", data["turns_per_s"]))
    if bars:
        ax.bar(range(len(bars)), [b[1] for b in bars], color="tab:green")
        ax.set_xticks(range(len(bars)))
        ax.set_xticklabels([b[0] for b in bars], fontsize=6)
        ax.set_yscale("log")
    ax.set_title("throughput vs the limit", fontsize=9)
    ax.tick_params(labelsize=7)
    broker = result.get("settings", {}).get("broker", "")
    fig.suptitle(f"switchboard bench {time.strftime('%Y-%m-%d %H:%M')} — {broker}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


def markdown_summary(result: dict[str, Any]) -> str:
    """The headline figures as a Markdown table (pasted into bench/README.md)."""
    h = result.get("headline", {})
    m = result.get("machine", {})
    s = result.get("settings", {})
    rows = [
        (
            "machine",
            f"{m.get('cpu')} x{m.get('cores')}, {m.get('mem_gib')} GiB, Python {m.get('python')}, "
            f"commit {m.get('commit')}, load average {m.get('loadavg_1_5_15_at_start')} → "
            f"{m.get('loadavg_1_5_15_at_end')}",
        ),
        (
            "settings",
            f"broker {s.get('broker')}, {s.get('workers')} worker(s), {s.get('partitions')} partitions, "
            f"{s.get('conversations')} conversations, private {s.get('private_share')}, group filtered "
            f"{s.get('filtered_share')}, bursts {s.get('burst_prob')}x{s.get('burst_size')}, think "
            f"{s.get('think')} s, bot {s.get('bot')}, mode {s.get('mode')}",
        ),
    ]
    rows += [(k, str(v)) for k, v in h.items()]
    lines = ["| figure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"
