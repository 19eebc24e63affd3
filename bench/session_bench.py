"""Session-protocol benchmark: simulator capacity and client overhead on this machine.

    .venv/bin/python bench/session_bench.py [--sessions 200] [--turns 10] [--streams 10000]

1. turns/s: the sim (own process, think 0) driven by a lean aiohttp driver (its capacity), then by
   SessionClient (send + resumable subscription, the pipeline's client): every session opens its
   stream, sends user.message + system.message, waits for session.status_idle, repeats.
2. open streams: raw sockets open SSE streams until --streams are held; reports the sim's RSS.
3. client overhead per event: µs to parse one SSE frame and pass it through the Subscription, both
   end to end over an in-memory transport and for parse + dispatch alone.
4. start-up: `switchboard sim` as a process until it prints its port (interpreter start and imports
   included), and `SimServer.start()` in process (binding and serving). Printed, never asserted:
   tests/sim only check that it starts and answers (these were once pass marks there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.session import Preview, RetryPolicy, SessionClient, SystemMessage, TextBlock, UserMessage
from pipeline.session.models import ServerEvent, parse_server_event_json
from pipeline.session.subscription import Subscription
from pipeline.sim import SimServer

API_KEY = "bench-key"


def raise_fd_limit() -> int:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def start_sim() -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.sim.cli", "--port", "0", "--api-key", API_KEY, "--ping-interval", "30"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        preexec_fn=raise_fd_limit,
    )
    assert process.stdout is not None
    process.stdout.readline()
    port = int(process.stdout.readline().strip().removeprefix("port="))
    return process, port


def bench_sim_start(rounds: int = 5) -> dict[str, float]:
    """Best and median of `rounds` cold starts of the sim CLI, and of SimServer.start() in process."""
    cli: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        process, _port = start_sim()
        cli.append(time.perf_counter() - started)
        process.terminate()
        process.wait(10)

    async def in_process() -> list[float]:
        took: list[float] = []
        for _ in range(rounds):
            server = SimServer()
            started = time.perf_counter()
            await server.start()
            took.append(time.perf_counter() - started)
            await server.stop()
        return took

    server = asyncio.run(in_process())
    return {
        "cli_best_s": min(cli),
        "cli_median_s": statistics.median(cli),
        "server_best_ms": min(server) * 1000,
        "server_median_ms": statistics.median(server) * 1000,
    }


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def new_sessions(root: str, count: int) -> list[str]:
    async with httpx.AsyncClient(base_url=root) as http:
        return [str((await http.post("/_sim/sessions")).json()["id"]) for _ in range(count)]


# ---------------------------------------------------------------------------- 1. turns/s


async def bench_client_turns(root: str, sessions: int, turns: int, pool: int = 16) -> dict[str, float]:
    client = SessionClient(
        api_key=API_KEY,
        base_url=root + "/api/v3",
        max_connections=pool,
        max_keepalive_connections=pool,
        retry=RetryPolicy(max_attempts=5, base_delay=0.01),
    )
    session_ids = await new_sessions(root, sessions)
    latencies: list[float] = []

    async def drive(session_id: str) -> None:
        subscription = client.subscribe(session_id)
        iterator = subscription.__aiter__()
        # The first history read opens the subscription; then one message per idle.
        for turn in range(turns):
            sent_at = time.perf_counter()
            await client.send(
                session_id,
                [
                    UserMessage(content=[TextBlock(text=f"turn {turn}")]),
                    SystemMessage(content=[TextBlock(text="contract")]),
                ],
            )
            async for item in iterator:
                if not isinstance(item, Preview) and item.type == "session.status_idle":
                    break
            latencies.append(time.perf_counter() - sent_at)
        await iterator.aclose()  # type: ignore[attr-defined]

    started = time.perf_counter()
    await asyncio.gather(*(drive(s) for s in session_ids))
    elapsed = time.perf_counter() - started
    await client.aclose()
    latencies.sort()
    return {
        "turns": sessions * turns,
        "seconds": elapsed,
        "turns_per_s": sessions * turns / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


async def bench_sim_turns(root: str, sessions: int, turns: int) -> dict[str, float]:
    """Sim capacity with a lean driver (aiohttp, raw SSE lines) so the client is not the bottleneck."""
    import aiohttp

    session_ids = await new_sessions(root, sessions)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {
        "events": [
            {"type": "user.message", "content": [{"type": "text", "text": "bench"}]},
            {"type": "system.message", "content": [{"type": "text", "text": "contract"}]},
        ]
    }
    latencies: list[float] = []
    posts = aiohttp.TCPConnector(limit=32)
    streams = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=posts, headers=headers) as post_http,
        aiohttp.ClientSession(connector=streams, headers=headers) as stream_http,
    ):

        async def drive(session_id: str) -> None:
            async with stream_http.get(f"{root}/api/v3/sessions/{session_id}/events/stream") as stream:
                for _ in range(turns):
                    sent_at = time.perf_counter()
                    async with post_http.post(f"{root}/api/v3/sessions/{session_id}/events", json=body) as answer:
                        await answer.read()
                    while (line := await stream.content.readline()) != b"event: session.status_idle\n":
                        if not line:
                            raise RuntimeError("stream ended")
                    latencies.append(time.perf_counter() - sent_at)

        started = time.perf_counter()
        await asyncio.gather(*(drive(s) for s in session_ids))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "turns": sessions * turns,
        "seconds": elapsed,
        "turns_per_s": sessions * turns / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
    }


# ---------------------------------------------------------------------------- 2. open streams


async def open_raw_stream(port: int, session_id: str) -> asyncio.StreamWriter | None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            f"GET /api/v3/sessions/{session_id}/events/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {API_KEY}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            writer.close()
            return None
        return writer
    except (OSError, asyncio.IncompleteReadError):
        return None


async def bench_streams(root: str, port: int, pid: int, target: int) -> dict[str, float]:
    baseline = rss_mib(pid)
    per_session = 100
    session_ids = await new_sessions(root, max(target // per_session, 1))
    writers: list[asyncio.StreamWriter] = []
    batch = 500
    started = time.perf_counter()
    for offset in range(0, target, batch):
        opened = await asyncio.gather(
            *(open_raw_stream(port, session_ids[(offset + i) // per_session % len(session_ids)]) for i in range(batch))
        )
        writers.extend(w for w in opened if w is not None)
        if len(writers) < offset + batch:
            break
    open_seconds = time.perf_counter() - started
    await asyncio.sleep(1.0)
    async with httpx.AsyncClient(base_url=root) as http:
        stats = (await http.get("/_sim/stats")).json()
        # Fan-out check: one turn on a session with 100 open streams still completes promptly.
        fanout_session = session_ids[0]
        turn_started = time.perf_counter()
        await http.post(
            f"/api/v3/sessions/{fanout_session}/events",
            headers={"Authorization": f"Bearer {API_KEY}"},
            json={
                "events": [
                    {"type": "user.message", "content": [{"type": "text", "text": "fan-out"}]},
                    {"type": "system.message", "content": [{"type": "text", "text": "c"}]},
                ]
            },
        )
        while True:
            page = (
                await http.get(
                    f"/api/v3/sessions/{fanout_session}/events",
                    params={"order": "desc", "limit": 1},
                    headers={"Authorization": f"Bearer {API_KEY}"},
                )
            ).json()
            if page["data"] and page["data"][0]["type"] == "session.status_idle":
                break
            await asyncio.sleep(0.01)
        fanout_ms = (time.perf_counter() - turn_started) * 1000
    held_rss = rss_mib(pid)
    for writer in writers:
        writer.close()
    return {
        "requested": target,
        "held": stats["open_streams"],
        "open_seconds": open_seconds,
        "rss_baseline_mib": baseline,
        "rss_held_mib": held_rss,
        "kib_per_stream": (held_rss - baseline) * 1024 / max(stats["open_streams"], 1),
        "fanout_turn_ms": fanout_ms,
    }


# ---------------------------------------------------------------------------- 3. client overhead


def typical_turn_frames(turn: int) -> list[dict[str, Any]]:
    stamp = "2026-04-01T00:00:00.000001Z"
    base = f"sevt-{turn:06d}"
    frames: list[dict[str, Any]] = [
        {"type": "session.status_running", "id": f"{base}-1", "processed_at": stamp},
        {"type": "span.model_request_start", "id": f"{base}-2", "processed_at": stamp},
        {
            "type": "event_start",
            "id": f"{base}-p0",
            "processed_at": stamp,
            "event": {"type": "agent.message", "id": f"{base}-3"},
        },
    ]
    for n in range(4):
        frames.append(
            {
                "type": "event_delta",
                "id": f"{base}-p{n + 1}",
                "processed_at": stamp,
                "event_id": f"{base}-3",
                "delta": {"type": "content_delta", "index": 0, "content": {"type": "text", "text": "chunk "}},
            }
        )
    frames += [
        {
            "type": "agent.message",
            "id": f"{base}-3",
            "processed_at": stamp,
            "content": [{"type": "text", "text": '{"segments":[{"type":"text","data":{"text":"echo: hello"}}]}'}],
        },
        {
            "type": "span.model_request_end",
            "id": f"{base}-4",
            "processed_at": stamp,
            "model_request_start_id": f"{base}-2",
            "model_usage": {
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "input_tokens": 12,
                "output_tokens": 8,
            },
            "is_error": False,
        },
        {
            "type": "session.thread_status_idle",
            "id": f"{base}-5",
            "processed_at": stamp,
            "agent_name": "a",
            "session_thread_id": "sthr-1",
            "stop_reason": {"type": "end_turn"},
        },
        {
            "type": "session.usage",
            "id": f"sevt-usg-{base}-6",
            "processed_at": stamp,
            "usage": {"input_tokens": 12, "output_tokens": 8},
        },
        {"type": "session.status_idle", "id": f"{base}-6", "processed_at": stamp, "stop_reason": {"type": "end_turn"}},
    ]
    return frames


async def bench_client_overhead(turns: int) -> dict[str, float]:
    frames = [f for t in range(turns) for f in typical_turn_frames(t)]
    frames.append({"type": "session.deleted", "id": "sevt-end", "processed_at": "t"})
    body = b"".join(f"event: {f['type']}\ndata: {json.dumps(f)}\n\n".encode() for f in frames)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)
        return httpx.Response(200, json={"data": [], "next_page": None})

    client = SessionClient(api_key="k", base_url="http://bench.test/api/v3", transport=httpx.MockTransport(handler))
    started = time.perf_counter()
    delivered = 0
    async for _ in client.subscribe("s", deltas=True):
        delivered += 1
    end_to_end = (time.perf_counter() - started) / len(frames) * 1e6
    await client.aclose()

    payloads = [json.dumps(f) for f in frames]
    subscription = Subscription[ServerEvent](client, "s", deltas=True)
    started = time.perf_counter()
    for payload in payloads:
        subscription.accept_live(parse_server_event_json(payload))
    dispatch = (time.perf_counter() - started) / len(payloads) * 1e6
    return {
        "events": len(frames),
        "delivered": delivered,
        "us_per_event_end_to_end": end_to_end,
        "us_per_event_parse_dispatch": dispatch,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--streams", type=int, default=10_000)
    args = parser.parse_args()
    raise_fd_limit()

    start = await asyncio.to_thread(bench_sim_start)
    print(
        f"sim start: CLI process to port printed {start['cli_median_s']:.2f} s median "
        f"(best {start['cli_best_s']:.2f} s, interpreter and imports included); SimServer.start() in process "
        f"{start['server_median_ms']:.1f} ms median (best {start['server_best_ms']:.1f} ms)"
    )

    overhead = await bench_client_overhead(2000)
    print(
        f"client overhead: {overhead['us_per_event_end_to_end']:.1f} µs/event end to end (SSE decode + parse + "
        f"subscription, {overhead['events']} events), {overhead['us_per_event_parse_dispatch']:.1f} µs/event "
        "parse + dispatch only"
    )

    process, port = start_sim()
    root = f"http://127.0.0.1:{port}"
    try:
        turns = await bench_sim_turns(root, args.sessions, args.turns)
        print(
            f"sim capacity (think 0, {args.sessions} concurrent sessions, lean aiohttp driver in another process): "
            f"{turns['turns_per_s']:.0f} turns/s ({turns['turns']} turns in {turns['seconds']:.2f}s, "
            f"p50 {turns['p50_ms']:.1f} ms, p99 {turns['p99_ms']:.1f} ms per turn)"
        )
        client_turns = await bench_client_turns(root, args.sessions, args.turns)
        print(
            f"SessionClient end to end (send + resumable subscription, {args.sessions} sessions): "
            f"{client_turns['turns_per_s']:.0f} turns/s (p50 {client_turns['p50_ms']:.1f} ms, "
            f"p99 {client_turns['p99_ms']:.1f} ms per turn)"
        )
        streams = await bench_streams(root, port, process.pid, args.streams)
        print(
            f"sim open streams: held {streams['held']}/{streams['requested']} "
            f"(opened in {streams['open_seconds']:.1f}s), "
            f"RSS {streams['rss_baseline_mib']:.0f} MiB idle -> {streams['rss_held_mib']:.0f} MiB held "
            f"(~{streams['kib_per_stream']:.1f} KiB/stream); a turn fanned out to 100 streams took "
            f"{streams['fanout_turn_ms']:.0f} ms"
        )
    finally:
        process.terminate()
        process.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
