"""The chaos bench run from a test: the developer's settings kept out, the result kept beside the
test's files, and the exactly-once checks every chaos test makes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipeline.bench.chaos import ChaosConfig, run_chaos


async def run_chaos_for_test(cfg: ChaosConfig, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The result, and the part of it an assertion message shows (accounting, evidence, faults)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_") and k != "SWITCHBOARD_TEST_BROKERS"}
    try:
        result = await run_chaos(cfg)
    finally:
        os.environ.update(saved)
    (tmp_path / "chaos.json").write_text(json.dumps(result, indent=2, default=str))
    shown = {
        "accounting": result["accounting"],
        "evidence": result.get("evidence"),
        "faults": result["faults"],
        "run_dir": result["run_dir"],
    }
    if "kafka_cluster" in result:
        shown["kafka_cluster"] = {k: v for k, v in result["kafka_cluster"].items() if k != "lag_samples"}
    return result, json.dumps(shown, indent=1, default=str)[:20000]


def assert_answered_exactly_once(result: dict[str, Any], detail: str) -> None:
    """Nearly every message accepted, and each accepted one answered once, in its thread, and
    posted to its session once."""
    acc = result["accounting"]
    assert acc["triggering_accepted"] >= 0.95 * acc["messages_sent"], detail
    assert acc["lost"] == 0, detail
    assert acc["duplicated"] == 0, detail
    assert acc["posted_twice"] == 0, detail
    assert acc["redelivered_same_outbound_id"] == 0, detail  # the same reply shown twice
    assert acc["misthreaded"] == 0, detail
