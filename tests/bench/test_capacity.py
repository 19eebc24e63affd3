"""The capacity run's parts: CPU lists, pinning real processes, the model's arithmetic, the table;
and (slow) one short run of `switchboard bench --scale-workers` on a real stack."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline.bench.capacity import allowed_cpus, model_check, parse_cpus, pin_tree, table

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_lists_are_read_like_taskset_and_bad_ones_are_named() -> None:
    assert parse_cpus("1") == {1}
    assert parse_cpus("0-2,5") == {0, 1, 2, 5}
    for bad in ("", "a", "1-x", ","):
        with pytest.raises(ValueError, match="CPU list"):
            parse_cpus(bad)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs to tell the sets apart")
def test_pinning_reaches_every_thread_and_the_children() -> None:
    # A process with a second thread and a child process: all of them move to CPU 1.
    code = (
        "import subprocess, sys, threading, time\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        time.sleep(0.2)
        assert len(os.listdir(f"/proc/{proc.pid}/task")) >= 2
        pin_tree(proc.pid, {0})
        assert allowed_cpus(proc.pid) == [0] and allowed_cpus(child) == [0]
        pin_tree(proc.pid, {1})
        assert allowed_cpus(proc.pid) == [1]
        assert allowed_cpus(child) == [1]
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            assert os.sched_getaffinity(int(tid)) == {1}
    finally:
        with contextlib.suppress(ProcessLookupError, NameError):
            os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.wait()


def _run(n: int, worker_s: float, other: dict[str, float], turns: int, idle: dict[str, float], peak: float) -> dict:
    wall = 20.0
    return {
        "workers": n,
        "idle_pct_of_core": idle,
        "fixed": {
            "turns": turns,
            "wall_s": wall,
            "turns_per_s": turns / wall,
            "cpu_s": {"workers": worker_s, **other},
            "worker_cpu_ms_per_turn": round(worker_s * 1000 / turns, 3),
            "infra_cpu_ms_per_turn": {
                **{k: round(v * 1000 / turns, 2) for k, v in other.items()},
                "total": round(sum(other.values()) * 1000 / turns, 2),
            },
            "per_worker": {f"worker{i}": {"cpu_ms_per_delivered": 10.0, "pct_of_core": 5.0} for i in range(n)},
            "kafka": {"records_per_turn": 7.0, "record_bytes_per_turn": 5000},
            "redis": {"commands_per_turn": 55.0, "round_trips_per_turn": 6.5, "net_bytes_per_turn": 9000},
            "session_calls_per_turn": {"user_turn": 1.0},
        },
        "filtered_only": {"worker_cpu_us_per_msg": 400.0, "infra_cpu_us_per_msg": {"broker": 100.0, "bench": 50.0}},
        "max": {
            "steps": [
                {"turns_per_s": peak * 0.8, "ok": True, "cpu_pct_by_process": {"worker0": 60.0, "broker": 40.0}},
                {
                    "turns_per_s": peak,
                    "ok": False,
                    "cpu_pct_by_process": {"worker0": 95.0, "broker": 55.0},
                    # 5% of the worker CPU and 25% of the other CPU went to other programs.
                    "cpu_sets_busy": {"workers": {"busy_pct": 100.0}, "others": {"busy_pct": 80.0}},
                },
            ],
            "max_turns_per_s": peak * 0.8,
            "max_offered_msgs_per_s": 200.0,
            "ceiling_found": True,
        },
    }


def test_the_model_predicts_from_the_one_worker_run_and_names_the_first_limit() -> None:
    # N=1: 800 turns in 20 s, workers 8 s of CPU (10 ms/turn; 1 s of it idle: 5% of a core),
    # the others 4 s (5 ms/turn; idle 10% of a core = 2 s over the phase).
    one = _run(1, 8.0, {"broker": 3.0, "redis": 0.5, "sim": 0.5}, 800, {"worker0": 5.0, "broker": 10.0}, 90.0)
    four = _run(
        4,
        10.0,
        {"broker": 4.0, "redis": 0.5, "sim": 0.5},
        800,
        {f"worker{i}": 5.0 for i in range(4)} | {"broker": 12.0},
        80.0,
    )
    check = model_check([one, four], worker_cores=1.0, other_cores=1.0)
    assert check["marginal_worker_cpu_ms_per_turn"] == pytest.approx(8.75)  # (8 - 0.05 * 20) s / 800
    assert check["marginal_other_cpu_ms_per_turn"] == pytest.approx(2.5)  # (4 - 0.10 * 20) s / 800
    r1, r4 = check["rows"]
    # Flat: 1000 / 10 ms = 100 turns/s on the worker core, 1000 / 5 ms = 200 on the other: workers first.
    assert r1["predicted_flat"] == {
        "turns_per_s": 100.0,
        "worker_bound": 100.0,
        "other_bound": 200.0,
        "first_limit": "workers",
    }
    assert r4["predicted_flat"]["turns_per_s"] == 100.0  # flat: N does not matter
    # Idle model: 4 idle workers take 20% of the core first: (1 - 0.2) * 1000 / 8.75.
    assert r4["predicted_idle_model"]["worker_bound"] == pytest.approx(91.4, abs=0.1)
    assert r4["worker_cpu_ms_per_turn"] == {"flat": 10.0, "idle_model": 13.75, "measured": 12.5}
    assert r4["measured_peak"]["turns_per_s"] == 80.0 and r4["measured_peak"]["workers_pct_of_core"] == 95.0
    assert r4["ratio_peak_to_flat"] == 0.8
    # On the cores other programs left: 0.95 * 1000 / 10 ms and 0.75 * 1000 / 5 ms.
    assert r4["predicted_flat_on_cores_left"] == {
        "turns_per_s": 95.0,
        "worker_bound": 95.0,
        "other_bound": 150.0,
        "first_limit": "workers",
    }
    assert r4["ratio_peak_to_flat_on_cores_left"] == round(80 / 95, 2)
    text = table({"runs": [one, four], "check": check})
    assert text.count("\n| 1 |") == 2 and text.count("\n| 4 |") == 2


def test_a_short_capacity_run_accounts_for_every_process(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "pipeline.cli",
        "bench",
        "--quick",
        "--scale-workers",
        "1",
        "--filtered-rate",
        "50",
        "--out",
        str(tmp_path),
        "--name",
        "cap",
    ]
    if (os.cpu_count() or 1) >= 2:
        cmd += ["--pin-workers", "1", "--pin-others", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, timeout=400)
    result: dict[str, Any] = json.loads((tmp_path / "cap.json").read_text())
    run = result["capacity"]["runs"][0]
    fixed = run["fixed"]
    assert fixed["turns"] > 0
    assert set(fixed["per_worker"]) == {"worker0"}
    assert fixed["per_worker"]["worker0"]["delivered"] > 0
    assert fixed["worker_cpu_ms_per_turn"] > 0
    assert fixed["infra_cpu_ms_per_turn"]["broker"] > 0
    assert fixed["kafka"]["record_bytes_per_turn"] > fixed["kafka"]["records_per_turn"] > 0
    assert set(fixed["kafka"]["by_topic_per_turn"]) >= {"im.inbound", "session.input", "session.events"}
    assert fixed["redis"]["commands_per_turn"] > 0 and fixed["redis"]["net_bytes_per_turn"] > 0
    assert fixed["session_calls_per_turn"].get("user_turn", 0) > 0
    assert run["filtered_only"]["ingested"] == run["filtered_only"]["accepted"] > 0
    assert run["max"]["steps"]
    if (os.cpu_count() or 1) >= 2:
        assert run["cpus_allowed_at_end"]["worker0"] == [1]
        assert run["cpus_allowed_at_end"]["broker"] == [0]
    assert result["capacity"]["check"]["rows"][0]["predicted_flat"]["turns_per_s"] > 0
    assert (tmp_path / "cap.md").read_text().count("| 1 |") == 2
