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
    """Every message accepted, and each answered once, in its thread, and posted to its session once.

    Counted exactly, with no allowance for messages never accepted. A webhook refused or cut off
    by a fault (a SIGKILLed worker, Redis or a Kafka leader away) is not a message lost: the load
    generator sends it again with the same body, as the platforms do, 120 times 0.5 s apart (with
    a 15 s timeout per attempt), so for over a minute. No fault the chaos schedules lasts that
    long: a worker is killed every 12 s with another one serving and a replacement started, Redis
    is back or failed over within seconds, a killed Kafka leader is down 15 s. So each message is
    accepted in the end (an attempt cut off after the ingress had in fact produced it is the same
    message: ingest drops the retry as a duplicate, and it is answered once). One the generator gave
    up on means the ingress refused it for a minute, which is a failure, not an allowance; every
    recorded chaos run (bench/results) has 0.
    """
    acc = result["accounting"]
    # Every message of the chaos mix triggers a turn (private chats only): sent = triggering.
    assert acc["triggering_never_accepted"] == 0, detail
    assert result["webhook"]["failed"] == 0, detail  # the generator gave up on none
    assert acc["triggering_accepted"] == acc["messages_sent"], detail
    assert acc["lost"] == 0, detail
    assert acc["duplicated"] == 0, detail
    assert acc["posted_twice"] == 0, detail
    assert acc["redelivered_same_outbound_id"] == 0, detail  # the same reply shown twice
    assert acc["misthreaded"] == 0, detail
