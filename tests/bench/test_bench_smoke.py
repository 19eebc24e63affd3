"""`switchboard bench --quick`: a few seconds of tiny load; the JSON result has every field with
sane values (no assertion on speed)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from pipeline.bench import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One `--quick` run (pipeline load, limit, bare turn, filtered phases) for the tests below."""
    out = tmp_path_factory.mktemp("bench")
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_") and k != "SWITCHBOARD_TEST_BROKERS"}
    try:
        code = main(["--quick", "--out", str(out), "--name", "smoke", "--think", "0.02", "--filtered"])
    finally:
        os.environ.update(saved)
    assert code == 0
    assert (out / "smoke.png").stat().st_size > 1000
    result: dict[str, Any] = json.loads((out / "smoke.json").read_text())
    return result


def assert_every_message_accounted(phase: dict[str, Any]) -> dict[str, Any]:
    """Every planned message sent, accepted and ingested; some turns, no more than triggered."""
    msgs: dict[str, Any] = phase["messages"]
    assert msgs["sent"] == msgs["planned"] > 0
    assert msgs["accepted"] == msgs["sent"] and msgs["failed"] == 0
    assert msgs["ingested"] == msgs["accepted"]
    assert 0 < phase["turns"] <= msgs["triggering"]
    return msgs


def test_bench_quick_writes_a_sane_result(quick_run: dict[str, Any]) -> None:
    result = quick_run

    load = result["load"]
    msgs = assert_every_message_accounted(load)
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
    # Round trips: counted by the worker once it exports switchboard_redis_round_trips_total.
    trips = load["redis"]["round_trips_per_turn"]
    assert trips == "n/a" or 0 < trips <= load["redis"]["ops_per_turn"]
    kafka = load["kafka"]
    assert kafka["records_by_topic"]["im.inbound"] >= msgs["accepted"]
    assert kafka["records_per_turn"] >= 3  # at least inbound, input, events, outbound per turn
    assert kafka["records_per_turn_by_topic"]["session.input"] > 0
    assert len(load["timeline"]) >= 3

    limit = result["limit"]
    assert limit["bare_chain"]["records_per_s"] > 0
    assert limit["limit_turns_per_s"] > 0 and 0 < limit["ratio_turns_to_limit"]
    assert result["filtered"]["ingest_msgs_per_s"] > 0
    head = result["headline"]
    assert head["turns_per_s_per_worker"] > 0 and head["ratio_to_limit"] > 0


def test_bare_turn_figures_are_present_and_sane(quick_run: dict[str, Any]) -> None:
    """The bare turn ran on the same broker and simulator, with the same traffic, and its figures
    and ratios are in the result and the headline."""
    bare = quick_run["bare_turn"]
    same = bare["same_rate"]
    assert_every_message_accounted(same)
    assert same["notices"] == 0  # every simulated reply was a valid segments reply
    assert same["throughput"]["turns_per_s"] > 0
    lat = same["latency_ms"]
    assert lat["agent"]["p50"] >= 20 * 0.9  # think 0.02 s
    for stage in ("ingress->ingest", "ingest->dispatch_in", "dispatch->stream", "stream->render", "render->delivered"):
        assert lat["stages"][stage]["n"] > 0, stage
    assert 0 <= lat["end_to_end"]["p50"] <= lat["end_to_end"]["p99"]
    assert same["cpu"]["worker_ms_per_turn"] > 0
    assert same["redis"] is None  # no Redis in the bare turn
    # The pipeline's hops: every message into topic 1, ~1 command and 2 session events per turn, 1 reply.
    by_topic = same["kafka"]["records_per_turn_by_topic"]
    inbound = next(v for t, v in by_topic.items() if t.endswith("-inbound"))
    events = next(v for t, v in by_topic.items() if t.endswith("-events"))
    assert inbound >= 1 and 1.5 <= events <= 2.5
    assert bare["platform"] == {"rejected": {}, "duplicates": 0}

    ramp = bare["max"]
    assert ramp["steps"] and ramp["steps"][0]["turns_per_s"] > 0 and isinstance(ramp["ceiling_found"], bool)
    assert bare["bare_turn_max_turns_per_s"] is None or bare["bare_turn_max_turns_per_s"] > 0
    assert bare["bare_turn_turns_per_s"] == same["throughput"]["turns_per_s"]
    assert bare["ratio_turns_at_same_rate"] > 0
    assert bare["ratio_cpu_per_turn"] == round(
        same["cpu"]["worker_ms_per_turn"] / quick_run["load"]["cpu"]["worker_ms_per_turn"], 3
    )
    head = quick_run["headline"]
    assert head["bare_turn_turns_per_s"] > 0 and head["ratio_cpu_per_turn_bare_to_pipeline"] > 0
    if bare["bare_turn_max_turns_per_s"]:
        assert head["ratio_turns_to_bare_turn"] > 0


def test_each_kafka_hop_is_split_into_its_parts_for_the_pipeline_and_the_bare_turn(quick_run: dict[str, Any]) -> None:
    """The records carry the finer stamps on both sides (pipeline/hopstamps.py, SWITCHBOARD_HOP_STAMPS
    set by the bench; the bare worker's own), so every hop has every part; the bare turn has no step."""
    rows = quick_run["bare_turn"]["hop_breakdown"]["rows"]
    for hop in ("ingest", "dispatch", "render", "egress"):
        for part in ("produce", "broker_fetch", "queue", "handle", "total"):
            entry = rows[hop][part]
            assert entry["pipeline"]["n"] > 0 and entry["bare"]["n"] > 0, (hop, part)
        assert rows[hop]["step"]["pipeline"]["n"] > 0 and rows[hop]["step"]["bare"] is None
    for row in ("ingress", "stream"):
        assert rows[row]["handle"]["pipeline"]["n"] > 0 and rows[row]["handle"]["bare"]["n"] > 0
    assert quick_run["load"]["latency_ms"]["hop_parts"]["render"]["handle"]["n"] > 0
    # Each phase says how loaded the machine was, the two compared phases running one after the other.
    assert len(quick_run["load"]["loadavg_1m"]) == len(quick_run["bare_turn"]["same_rate"]["loadavg_1m"]) == 2
