"""`switchboard bench --quick`: a few seconds of tiny load; the JSON result has every field with
sane values (no assertion on speed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.bench import main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]


def test_bench_quick_writes_a_sane_result(tmp_path: Path) -> None:
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_") and k != "SWITCHBOARD_TEST_BROKERS"}
    try:
        code = main(["--quick", "--out", str(tmp_path), "--name", "smoke", "--think", "0.02", "--filtered"])
    finally:
        os.environ.update(saved)
    assert code == 0
    result = json.loads((tmp_path / "smoke.json").read_text())
    assert (tmp_path / "smoke.png").stat().st_size > 1000

    load = result["load"]
    msgs = load["messages"]
    assert msgs["sent"] == msgs["planned"] > 0
    assert msgs["accepted"] == msgs["sent"] and msgs["failed"] == 0
    assert msgs["ingested"] == msgs["accepted"]
    assert 0 < load["turns"] <= msgs["triggering"]
    tp = load["throughput"]
    assert tp["inbound_msgs_per_s"] > 0 and tp["turns_per_s"] > 0
    lat = load["latency_ms"]
    for name in ("end_to_end", "client_end_to_end", "agent", "pipeline_overhead", "ingress_ack"):
        s = lat[name]
        assert s["n"] > 0, name
        assert 0 <= s["p50"] <= s["p90"] <= s["p99"] <= s["max"], (name, s)
    assert lat["agent"]["p50"] >= 20 * 0.9  # think 0.02 s: the agent's time is at least that
    assert lat["end_to_end"]["p50"] >= lat["pipeline_overhead"]["p50"]
    for stage in ("ingress->ingest", "ingest->dispatch_in", "dispatch->stream", "stream->render", "render->delivered"):
        assert lat["stages"][stage]["n"] > 0, stage
    cpu = load["cpu"]
    assert cpu["worker_ms_per_turn"] > 0 and cpu["generator_thread_seconds"] >= 0
    assert 0 < load["memory"]["worker_rss_mib"]["worker0"] < 4096
    assert load["redis"]["ops_per_turn"] > 0
    kafka = load["kafka"]
    assert kafka["records_by_topic"]["im.inbound"] >= msgs["accepted"]
    assert kafka["records_per_turn"] >= 3  # at least inbound, input, events, outbound per turn
    assert len(load["timeline"]) >= 3

    limit = result["limit"]
    assert limit["bare_chain"]["records_per_s"] > 0
    assert limit["limit_turns_per_s"] > 0 and 0 < limit["ratio_turns_to_limit"]
    assert result["filtered"]["ingest_msgs_per_s"] > 0
    head = result["headline"]
    assert head["turns_per_s_per_worker"] > 0 and head["ratio_to_limit"] > 0
