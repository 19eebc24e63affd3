"""The per-hop breakdown: each Kafka hop split into produce, broker + fetch, step, queue and handle
from the stamps a delivered reply carries, aggregated, and compared with the bare turn's."""

from __future__ import annotations

import pytest

from pipeline.bench.hops import compare_breakdowns, format_breakdown, hop_breakdown, hop_parts
from pipeline.bench.load import Delivery

# One pipeline turn, ms: every stamp of pipeline/hopstamps.py, chosen so each part is distinct.
TURN = {
    "ingress": 0.0,
    "ingest.sent": 1.0,
    "ingest.acked": 4.0,  # produce 3
    "ingest.fetched": 9.0,  # broker + fetch 5
    "ingest": 9.5,
    "ingest.stepped": 11.0,  # step 2
    "ingest.started": 12.0,  # queue 1
    "dispatch.sent": 14.0,  # handle 2
    "dispatch.acked": 15.0,
    "dispatch.fetched": 35.0,
    "dispatch.stepped": 35.0,
    "dispatch.started": 40.0,
    "dispatch_in": 40.0,
    "dispatch": 41.0,
    "stream": 141.0,  # 100 ms of agent
    "render.sent": 141.5,
    "render.acked": 143.0,
    "render.fetched": 143.0,
    "render.stepped": 143.5,
    "render.started": 144.0,
    "egress.sent": 147.0,
    "egress.acked": 148.0,
    "egress.fetched": 150.0,
    "egress.stepped": 150.0,
    "egress.started": 151.0,
}


def reply(hops: dict[str, float], delivered_at: float, kind: str = "reply") -> Delivery:
    return Delivery("c", kind, None, "echo", hops, delivered_at, "out-1")


def test_each_hop_is_split_into_parts_that_sum_to_its_total() -> None:
    parts = hop_parts(TURN, 155.0)
    assert parts["ingress"] == {"handle": 1.0, "total": 1.0}
    assert parts["ingest"] == {
        "produce": 3.0,
        "broker_fetch": 5.0,
        "sent_to_fetched": 8.0,
        "step": 2.0,
        "queue": 1.0,
        "handle": 2.0,
        "total": 13.0,
    }
    assert parts["dispatch"]["broker_fetch"] == 20.0 and parts["dispatch"]["queue"] == 5.0
    assert parts["dispatch"]["handle"] == 1.0  # to the session call; the agent's time is not a hop's
    assert parts["stream"] == {"handle": 0.5, "total": 0.5}
    assert parts["egress"]["handle"] == 4.0  # work started → delivered
    for row in ("ingest", "dispatch", "render", "egress"):
        p = parts[row]
        assert p["produce"] + p["broker_fetch"] + p["step"] + p["queue"] + p["handle"] == p["total"]
    # The rows and the agent's time make up the whole turn.
    totals = sum(p["total"] for p in parts.values())
    assert totals + (TURN["stream"] - TURN["dispatch"]) == 155.0


def test_the_busy_wait_is_not_dispatchs_handle() -> None:
    held = {**TURN, "held": 40.5, "released": 240.5, "dispatch": 241.0, "stream": 341.0}
    assert hop_parts(held, 355.0)["dispatch"]["handle"] == 1.0


def test_without_the_acknowledgement_only_send_to_fetch_is_known() -> None:
    # Produced by another worker: its ack could not be joined to the record.
    hops = {k: v for k, v in TURN.items() if k != "render.acked"}
    render = hop_parts(hops, 155.0)["render"]
    assert "produce" not in render and "broker_fetch" not in render
    assert render["sent_to_fetched"] == 1.5


def test_the_bare_turn_has_no_batch_step_so_its_queue_starts_at_the_fetch() -> None:
    hops = {k: v for k, v in TURN.items() if not k.endswith(".stepped")}
    ingest = hop_parts(hops, 155.0)["ingest"]
    assert "step" not in ingest
    assert ingest["queue"] == 3.0


def test_records_without_the_finer_stamps_give_no_parts() -> None:
    assert hop_parts({"ingress": 0.0, "ingest": 5.0, "dispatch": 9.0, "stream": 20.0}, 30.0) == {}


def test_the_breakdown_takes_replies_only_and_leaves_replays_out() -> None:
    later = {k: v + 1000 for k, v in TURN.items()}
    later["ingest.fetched"] += 10  # its broker + fetch: 15
    deliveries = [
        reply(TURN, 155.0),
        reply(later, 1155.0),
        reply(TURN, 155.0, kind="notice"),
        reply({**TURN, "replay": 500.0}, 600.0),
    ]
    breakdown = hop_breakdown(deliveries)
    assert list(breakdown) == ["ingress", "ingest", "dispatch", "stream", "render", "egress"]
    broker_fetch = breakdown["ingest"]["broker_fetch"]
    assert broker_fetch["n"] == 2
    assert broker_fetch["max"] == 15.0
    assert list(breakdown["ingest"]) == [
        "produce",
        "broker_fetch",
        "sent_to_fetched",
        "step",
        "queue",
        "handle",
        "total",
    ]


def figures(p50: float, p99: float, n: int = 10) -> dict[str, float]:
    return {"n": n, "p50": p50, "p90": p99, "p99": p99, "max": p99, "mean": p50}


def test_the_comparison_gives_ratios_and_names_where_the_pipeline_exceeds_the_bare_turn_most() -> None:
    pipeline = {
        "ingest": {
            "produce": figures(2, 6),
            "broker_fetch": figures(10, 40),
            "step": figures(3, 30),
            "total": figures(20, 90),
        },
        "egress": {"handle": figures(1, 2)},
    }
    bare = {
        "ingest": {"produce": figures(2, 5), "broker_fetch": figures(4, 10), "total": figures(7, 20)},
        "egress": {"handle": figures(2, 3)},
    }
    cmp = compare_breakdowns(pipeline, bare)
    row = cmp["rows"]["ingest"]
    assert row["broker_fetch"]["ratio_p50"] == 2.5 and row["broker_fetch"]["ratio_p99"] == 4.0
    assert row["broker_fetch"]["excess_p50_ms"] == 6.0
    assert row["step"]["bare"] is None and row["step"]["ratio_p50"] is None  # the bare turn has no step
    assert cmp["rows"]["egress"]["handle"]["ratio_p50"] == 0.5
    # Totals are sums of parts: the parts themselves are named, largest excess first.
    assert [f["part"] for f in cmp["largest_excess_p50"]] == ["ingest.broker_fetch"]
    assert [f["part"] for f in cmp["largest_excess_p99"]] == ["ingest.broker_fetch", "ingest.produce"]
    text = format_breakdown(cmp, "hop breakdown")
    assert "broker_fetch" in text and "10.00 / 40.00" in text and "2.5 / 4" in text
    assert "ingest.broker_fetch +6.00 ms" in text


@pytest.mark.parametrize("bare_p50", [0.0, None])
def test_no_ratio_to_a_bare_figure_of_zero_or_none(bare_p50: float | None) -> None:
    pipeline = {"render": {"queue": figures(1, 2)}}
    bare = {"render": {"queue": {"n": 1, "p50": bare_p50, "p99": bare_p50}}}
    assert compare_breakdowns(pipeline, bare)["rows"]["render"]["queue"]["ratio_p50"] is None
