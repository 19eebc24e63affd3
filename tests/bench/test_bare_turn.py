"""The bare turn's parts against the real session simulator and real HTTP (no broker here: the
whole bare turn on a broker runs in `test_bench_smoke.py`)."""

from __future__ import annotations

from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from pipeline.bench.bare_turn import PlatformStandIn, bare_turn_ratios
from pipeline.bench.bare_worker import BareConfig, BareWorker, read_until_idle, reply_segments
from pipeline.bench.runner import mean_lag_ms
from pipeline.sim.server import SimServer

API_KEY = "bare-test-key"


def config(policy: str = "merge") -> BareConfig:
    return BareConfig(
        bootstrap="127.0.0.1:1",  # never connected in these tests
        topics=("in", "input", "events", "out"),
        partitions=1,
        port=0,
        session_base="",
        sim_admin="",
        platform_url="",
        session_api_key=API_KEY,
        platform_token="t",
        busy_policy=policy,
        merge_window_max=2,
    )


async def test_one_turn_on_the_simulator_reads_the_reply_and_the_idle() -> None:
    """The wire format the bare worker speaks: stream opened first, one POST, read to the idle."""
    async with SimServer(api_key=API_KEY, think=0.0) as sim:
        session_id = await sim.create_session()
        url = f"{sim.base_url('ark')}/sessions/{session_id}/events"
        auth = {"Authorization": f"Bearer {API_KEY}"}
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/stream", headers=auth) as stream:
                assert stream.status == 200
                message = {"type": "user.message", "id": "sevt-bare-1", "content": [{"type": "text", "text": "hi"}]}
                async with http.post(url, json={"events": [message]}, headers=auth) as sent:
                    assert sent.status == 200, await sent.text()
                agent_message, idle = await read_until_idle(stream.content)
    assert idle["type"] == "session.status_idle"
    assert idle["stop_reason"]["type"] == "end_turn"
    assert agent_message is not None and agent_message["type"] == "agent.message"
    assert reply_segments(agent_message) == [{"type": "text", "data": {"text": "echo: hi"}}]


def test_reply_segments_refuses_what_is_not_a_segments_reply() -> None:
    def message(text: str) -> dict[str, Any]:
        return {"type": "agent.message", "content": [{"type": "text", "text": text}]}

    assert reply_segments(None) is None
    assert reply_segments(message("plain prose")) is None
    assert reply_segments(message('{"segments": []}')) is None
    assert reply_segments(message('{"segments": ["x"]}')) is None
    assert reply_segments(message('["segments"]')) is None
    assert reply_segments(message('{"segments": [{"type": "text", "data": {"text": "ok"}}]}')) == [
        {"type": "text", "data": {"text": "ok"}}
    ]


def command(i: int) -> dict[str, Any]:
    return {
        "conversation": "console:demo:c1",
        "bot": "demo",
        "chat_id": "c1",
        "message_ids": [f"m{i}"],
        "texts": [f"text {i}"],
        "hops": {"ingress": float(i), "held": float(i) + 0.5},
    }


async def test_held_messages_become_one_turn_under_merge_and_one_each_under_queue() -> None:
    merge = BareWorker(config("merge"))
    merge.held["console:demo:c1"] = [command(1), command(2), command(3)]
    turn = merge._take_held("console:demo:c1")  # noqa: SLF001
    assert turn is not None
    assert turn["message_ids"] == ["m1", "m2"] and turn["texts"] == ["text 1", "text 2"]  # the merge window: 2
    assert turn["hops"]["ingress"] == 1.0 and turn["hops"]["held"] == 1.5 and "released" in turn["hops"]
    assert merge._take_held("console:demo:c1") is not None  # m3 next  # noqa: SLF001
    assert merge._take_held("console:demo:c1") is None  # noqa: SLF001

    queue = BareWorker(config("queue"))
    queue.held["console:demo:c1"] = [command(1), command(2)]
    first = queue._take_held("console:demo:c1")  # noqa: SLF001
    assert first is not None and first["message_ids"] == ["m1"]


async def test_a_malformed_webhook_is_refused_and_counted() -> None:
    worker = BareWorker(config())
    app = web.Application()
    app.router.add_post("/webhooks/console/{bot}", worker.webhook)
    async with TestClient(TestServer(app)) as client:
        for body in (b"not json", b'{"text": "no chat"}', b"[1, 2]"):
            response = await client.post("/webhooks/console/demo", data=body)
            assert response.status == 400
            assert "malformed" in (await response.json())["error"]
    assert worker.stats["webhooks_malformed"] == 3
    assert worker.stats["webhooks"] == 0


async def test_the_platform_stand_in_checks_each_request_and_records_deliveries() -> None:
    platform = PlatformStandIn()
    await platform.start()
    try:
        watch = await platform.watch("demo")
        reply = {
            "id": "out-1",
            "kind": "reply",
            "chat_id": "c1",
            "reply_to": "m1",
            "segments": [{"type": "text", "data": {"text": "echo: msg:m1"}}],
            "hops": {"ingress": 1.0, "render": 2.0},
        }
        url = f"{platform.url}/bots/demo/messages"
        good = {"Authorization": f"Bearer {platform.token}"}
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json=reply, headers={"Authorization": "Bearer wrong"}) as r:
                assert r.status == 401
            async with http.post(url, json={**reply, "segments": []}, headers=good) as r:
                assert r.status == 400
            async with http.post(url, json={"kind": "reply"}, headers=good) as r:
                assert r.status == 400
            for _ in range(2):
                async with http.post(url, json=reply, headers=good) as r:
                    assert r.status == 200
    finally:
        await platform.stop()
    assert platform.rejected == {"unauthorized": 1, "malformed": 2}
    assert platform.duplicates == 1 and watch.count == 1
    [delivery] = platform.deliveries
    assert (delivery.chat_id, delivery.kind, delivery.reply_to, delivery.outbound_id) == ("c1", "reply", "m1", "out-1")
    assert delivery.tokens == ["m1"] and delivery.hops == {"ingress": 1.0, "render": 2.0}
    assert delivery.delivered_at > 0


def test_ratios_use_the_pipeline_max_when_the_ramp_ran_and_say_so_otherwise() -> None:
    bare = {
        "same_rate": {"throughput": {"turns_per_s": 40.0}, "cpu": {"worker_ms_per_turn": 2.5}},
        "max": {"max_turns_per_s": 200.0, "max_worker_cpu_ms_per_turn": 1.5, "ceiling_found": True},
    }
    fixed = {"load": {"throughput": {"turns_per_s": 40.0}, "cpu": {"worker_ms_per_turn": 10.0}}}
    r = bare_turn_ratios(fixed, bare)
    assert r["ratio_turns_at_same_rate"] == 1.0
    assert r["ratio_turns_to_bare_turn_max"] == 0.2 and "not its max" in r["ratio_turns_basis"]
    assert r["ratio_cpu_per_turn"] == 0.25 and r["bare_turn_cpu_ms_per_turn_at_max"] == 1.5
    assert "lower bound" not in r["ratio_turns_basis"]
    ramped = {**fixed, "max": {"max_turns_per_s": 90.0}}
    r = bare_turn_ratios(ramped, bare)
    assert r["ratio_turns_to_bare_turn_max"] == 0.45 and r["ratio_turns_basis"].startswith("pipeline max")
    unfinished = {**bare, "max": {"max_turns_per_s": 200.0, "ceiling_found": False}}
    assert "lower bound" in bare_turn_ratios(ramped, unfinished)["ratio_turns_basis"]
    assert bare_turn_ratios({}, {})["ratio_cpu_per_turn"] is None


def test_latency_ratios_compare_each_kafka_hop_and_the_overhead_with_the_bare_turn_at_the_same_rate() -> None:
    def latency(hop_p50: dict[str, float], overhead: tuple[float, float], own_p99: float) -> dict[str, Any]:
        return {
            "stages": {hop: {"p50": v, "p99": 3 * v} for hop, v in hop_p50.items()},
            "pipeline_overhead": {"p50": overhead[0], "p99": overhead[1]},
            "pipeline_overhead_excluding_busy_wait": {"p50": overhead[0], "p99": own_p99},
        }

    pipeline = latency(
        {"ingress->ingest": 12.0, "ingest->dispatch_in": 15.0, "dispatch->stream": 900.0, "stream->render": 10.0},
        (60.0, 300.0),
        120.0,
    )
    bare = latency(
        {"ingress->ingest": 8.0, "ingest->dispatch_in": 10.0, "dispatch->stream": 100.0, "render->delivered": 9.0},
        (40.0, 200.0),
        150.0,
    )
    r = bare_turn_ratios({"load": {"latency_ms": pipeline}}, {"same_rate": {"latency_ms": bare}})
    hops = r["same_rate_hops"]
    # The agent's think time is not a Kafka hop; a hop missing on one side has no ratio.
    assert set(hops) == {"ingress->ingest", "ingest->dispatch_in", "stream->render", "render->delivered"}
    assert hops["ingress->ingest"]["ratio_p50"] == 1.5 and hops["ingest->dispatch_in"]["ratio_p50"] == 1.5
    assert hops["stream->render"]["ratio_p50"] is None and hops["render->delivered"]["ratio_p50"] is None
    assert r["ratio_hop_p50_max"] == 1.5
    assert (r["ratio_overhead_p50"], r["ratio_overhead_p99"]) == (1.5, 1.5)
    assert r["ratio_overhead_excluding_busy_wait_p99"] == 0.8
    empty = bare_turn_ratios({}, {})
    assert empty["ratio_hop_p50_max"] is None and empty["ratio_overhead_excluding_busy_wait_p99"] is None


def test_message_ratios_show_a_side_that_answers_the_same_messages_in_fewer_turns() -> None:
    """As in a measured run: both ramps pass 854 msg/s, the pipeline in fewer, larger turns (its
    turns/s ratio is 0.8), and it passes one step more; per message it is not behind."""

    def step(rate: float, turns: float) -> dict[str, Any]:
        return {"offered_msgs_per_s": rate, "inbound_msgs_per_s": rate, "turns_per_s": turns}

    pipeline = {
        "load": {"cpu": {"worker_ms_per_inbound_msg": 0.8, "worker_ms_per_turn": 4.0, "worker_loop_lag_mean_ms": 1.5}},
        "max": {
            "steps": [step(569.5, 196.6), step(854.3, 213.6), step(1281.4, 209.6)],
            "max_turns_per_s": 213.6,
            "max_inbound_msgs_per_s": 1281.4,
        },
    }
    bare = {
        "same_rate": {"cpu": {"worker_ms_per_inbound_msg": 0.6, "worker_ms_per_turn": 2.0}},
        "max": {
            "steps": [step(569.5, 215.5), step(854.3, 267.0)],
            "max_turns_per_s": 267.0,
            "max_inbound_msgs_per_s": 854.3,
        },
    }
    r = bare_turn_ratios(pipeline, bare)
    assert r["ratio_turns_to_bare_turn_max"] == 0.8
    assert (r["pipeline_msgs_per_turn_at_max"], r["bare_turn_msgs_per_turn_at_max"]) == (4.0, 3.2)
    assert r["ratio_max_inbound_msgs"] == 1.5
    assert r["ratio_cpu_per_inbound_msg"] == 0.75 and r["ratio_cpu_per_turn"] == 0.5
    assert (r["pipeline_loop_lag_mean_ms"], r["bare_turn_loop_lag_mean_ms"]) == (1.5, None)
    empty = bare_turn_ratios({}, {})
    assert empty["ratio_max_inbound_msgs"] is None and empty["pipeline_msgs_per_turn_at_max"] is None


def test_the_mean_loop_lag_is_taken_between_two_readings() -> None:
    before = {"loop_lag_seconds": 1.0, "loop_lag_samples": 100.0}
    after = {"loop_lag_seconds": 1.3, "loop_lag_samples": 300.0}
    assert mean_lag_ms(before, after) == 1.5
    assert mean_lag_ms(after, after) is None and mean_lag_ms({}, {}) is None


def test_the_warm_load_defaults_to_half_a_minute_on_kafka_only() -> None:
    from argparse import Namespace

    from pipeline.bench.main import warm_load_seconds

    assert warm_load_seconds(Namespace(warm_load=None), "kafka") == 30.0
    assert warm_load_seconds(Namespace(warm_load=None), "tansu") == 0.0
    assert warm_load_seconds(Namespace(warm_load=None), "attached") == 0.0
    assert warm_load_seconds(Namespace(warm_load=5.0), "tansu") == 5.0
    assert warm_load_seconds(Namespace(warm_load=-1.0), "kafka") == 0.0
