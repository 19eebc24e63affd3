"""Takeover of a long connection after its holder is SIGKILLed.

Usage: .venv/bin/python bench/takeover_bench.py [--kills 5] [--workers 3] [--lease 6] [--interval 1]
                                                [--reverse] [--telegram] [--run-dir DIR]

A whole stack on this machine (embedded Tansu, Redis, the simulator, `--workers` worker processes)
with one OneBot bot on `ws-forward`, dialling a stand-in OneBot implementation's WebSocket server
(`pipeline/bench/onebot_peer.py`); with `--reverse`, a second bot on `ws-reverse` that the stand-in
dials (round robin over the running workers, reconnecting 0.5 s after a close); with `--telegram`,
a Telegram bot on `polling` against the stand-in Bot API of the connection tests
(`tests/connections/telegram_bot_api.py`, a development checkout's). Each round: the holder (read
from its lease in Redis) is SIGKILLed, and the bench times, from the kill,

- `lease`: a survivor holds the lease (polled every 10 ms in Redis),
- `socket`: the stand-in has the survivor's new socket (forward: it was dialled; reverse: it was
  accepted; Telegram: the survivor's first getUpdates),
- `answered`: a message sent once the stand-in saw its socket close (Telegram: at the kill) is
  answered (over the new socket; Telegram: by sendMessage),

then starts a replacement worker and waits 5 s before the next round. The stated bound for
`ws-forward` is lease + acquisition interval + the dial; where in its renewal period the lease was
when the holder died spreads the figures over the last third of that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis.asyncio as aioredis

from pipeline.bench.onebot_peer import OneBotPeer
from pipeline.stack import Stack, WorkerProcess
from tests.connections.telegram_bot_api import USER_BASE, BotApi
from tests.platforms.test_telegram import TOKEN as TELEGRAM_TOKEN

TOKEN = "bench-takeover-token"
SELF_ID = 10001000


def bots_toml(forward_url: str, reverse: bool, bot_api_url: str | None) -> str:
    common = f'self_id = "{SELF_ID}"\nlanguage = "en"\ncredentials = {{ access_token = "{TOKEN}" }}\n'
    out = (
        f'[[bots]]\nplatform = "onebot"\nbot_id = "fwd"\ntransport = "ws-forward"\napi_base = "{forward_url}"\n{common}'
    )
    if reverse:
        out += f'\n[[bots]]\nplatform = "onebot"\nbot_id = "rev"\ntransport = "ws-reverse"\n{common}'
    if bot_api_url is not None:
        out += (
            f'\n[[bots]]\nplatform = "telegram"\nbot_id = "tgp"\ntransport = "polling"\napi_base = "{bot_api_url}"\n'
            f'poll_timeout_seconds = 10\nlanguage = "en"\ncredentials = {{ token = "{TELEGRAM_TOKEN}" }}\n'
        )
    return out


def event(n: int) -> dict[str, Any]:
    text = f"takeover {n}"
    return {
        "time": int(time.time()),
        "self_id": SELF_ID,
        "post_type": "message",
        "message_type": "private",
        "sub_type": "friend",
        "message_id": 90_000 + n,
        "user_id": 70_000 + n,
        "message": [{"type": "text", "data": {"text": text}}],
        "raw_message": text,
        "font": 0,
        "sender": {"nickname": "bench"},
    }


async def lease_of(redis: aioredis.Redis, prefix: str, bot_id: str) -> tuple[str, int, str] | None:
    key = "lease:telegram:tgp:event" if bot_id == "tgp" else f"lease:onebot:{bot_id}:api"
    value = cast(str | None, await redis.get(f"{prefix}{key}"))  # the client decodes responses
    if not value:
        return None
    holder, token, state = value.split("|")
    return holder, int(token), state


def holder_worker(stack: Stack, holder: str) -> WorkerProcess | None:
    return next((w for w in stack.workers if w.is_running and w.instance_id == holder), None)


async def one_round(
    stack: Stack, redis: aioredis.Redis, prefix: str, peer: OneBotPeer, bot_id: str, n: int
) -> dict[str, float]:
    current = await lease_of(redis, prefix, bot_id)
    assert current is not None and current[2] == "up", f"{bot_id}: not held before the kill"
    victim = holder_worker(stack, current[0])
    assert victim is not None
    sockets_before = len(peer.sockets)
    held = {s.id for s in peer.open_sockets()}
    await victim.kill()
    killed = time.monotonic()
    # Once the stand-in saw its socket close (OneBot acknowledges no frame: one written into the dead
    # worker's socket is lost), a message: queued by the stand-in until a socket is open again.
    await peer.wait_until(lambda: not held & {s.id for s in peer.open_sockets()}, 30, "the socket closed")
    await peer.send_event(event(n))
    times: dict[str, float] = {}
    while len(times) < 3:
        now = time.monotonic() - killed
        assert now < 120, f"{bot_id}: no takeover within 120 s: {times}"
        if "lease" not in times:
            value = await lease_of(redis, prefix, bot_id)
            if value is not None and value[1] > current[1]:
                times["lease"] = now
        if "socket" not in times and len(peer.sockets) > sockets_before and peer.open_sockets():
            times["socket"] = now
        if "answered" not in times and any(a.params.get("user_id") == 70_000 + n for a in peer.replies()):
            times["answered"] = now
        await asyncio.sleep(0.01)
    return times


async def polling_round(stack: Stack, redis: aioredis.Redis, prefix: str, api: BotApi, n: int) -> dict[str, float]:
    current = await lease_of(redis, prefix, "tgp")
    assert current is not None and current[2] == "up", "tgp: not held before the kill"
    victim = holder_worker(stack, current[0])
    assert victim is not None
    await victim.kill()
    killed = time.monotonic()
    polls_before = len(api.polls)
    # Telegram keeps updates until a poll confirms them: one added at the kill waits for the survivor.
    api.add(api.private_text(n, f"takeover {n}"))
    times: dict[str, float] = {}
    while len(times) < 3:
        now = time.monotonic() - killed
        assert now < 120, f"tgp: no takeover within 120 s: {times}"
        if "lease" not in times:
            value = await lease_of(redis, prefix, "tgp")
            if value is not None and value[1] > current[1]:
                times["lease"] = now
        if "socket" not in times and len(api.polls) > polls_before:
            times["socket"] = now
        if "answered" not in times and any(r["chat_id"] == USER_BASE + n for r in api.replies):
            times["answered"] = now
        await asyncio.sleep(0.01)
    return times


def summary(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    out = {}
    for key in ("lease", "socket", "answered"):
        values = [r[key] for r in rounds]
        out[key] = {
            "min": round(min(values), 2),
            "median": round(statistics.median(values), 2),
            "max": round(max(values), 2),
        }
    return out


async def main(args: argparse.Namespace) -> int:
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="sb-takeover-"))
    server = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=5.0)
    await server.serve()
    config = run_dir / "bots.toml"
    bot_api = await BotApi().start() if args.telegram else None
    config.write_text(bots_toml(server.url, args.reverse, bot_api.url if bot_api else None))
    prefix = f"takeover{int(time.time())}:"
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_REDIS_PREFIX": prefix,
        "SWITCHBOARD_PARTITIONS": "4",
        "SWITCHBOARD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
        "SWITCHBOARD_CONNECTION_LEASE_SECONDS": str(args.lease),
        "SWITCHBOARD_CONNECTION_ACQUIRE_INTERVAL_SECONDS": str(args.interval),
        "SWITCHBOARD_LOG_LEVEL": "INFO",  # the worker logs say when each holding began and ended
    }
    stack = Stack(settings_env=env, web_port=0, think=0.0, run_dir=run_dir)
    client = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=5.0, reconnect_interval=0.5)
    results: dict[str, Any] = {"workers": args.workers, "lease_seconds": args.lease, "acquire_interval": args.interval}
    try:
        print(f"starting {args.workers} workers (logs in {run_dir})…", flush=True)
        await stack.start(workers=0)
        for _ in range(args.workers):
            await stack.add_worker()
        redis = aioredis.from_url(stack.env["SWITCHBOARD_REDIS_URL"], decode_responses=True)
        peers = {"fwd": server}
        if args.reverse:
            client.dial(lambda: [f"ws://127.0.0.1:{w.port}/onebot/ws/rev" for w in stack.workers if w.is_running])
            peers["rev"] = client
        for bot_id, peer in peers.items():
            await peer.wait_until(
                cast(Callable[[], bool], lambda p=peer: len(p.open_sockets()) == 1), 60, f"{bot_id} connected"
            )
        if bot_api is not None:
            await server.wait_until(lambda: len(bot_api.polls) >= 1, 60, "tgp polled")
        await asyncio.sleep(5.0)
        n = 0
        for bot_id, peer in peers.items():
            rounds = []
            for k in range(args.kills):
                n += 1
                times = await one_round(stack, redis, prefix, peer, bot_id, n)
                rounds.append(times)
                print(
                    f"{bot_id} kill {k + 1}: lease {times['lease']:.2f} s, socket {times['socket']:.2f} s, "
                    f"answered {times['answered']:.2f} s",
                    flush=True,
                )
                await stack.add_worker()
                await asyncio.sleep(5.0)
            results[bot_id] = {"rounds": rounds, "summary": summary(rounds)}
        if bot_api is not None:
            rounds = []
            for k in range(args.kills):
                n += 1
                times = await polling_round(stack, redis, prefix, bot_api, n)
                rounds.append(times)
                print(
                    f"tgp kill {k + 1}: lease {times['lease']:.2f} s, first poll {times['socket']:.2f} s, "
                    f"answered {times['answered']:.2f} s",
                    flush=True,
                )
                await stack.add_worker()
                await asyncio.sleep(5.0)
            results["tgp"] = {"rounds": rounds, "summary": summary(rounds), "conflicts": bot_api.conflicts}
        await redis.aclose()
    finally:
        await client.stop()
        await stack.stop()
        await server.stop()
        if bot_api is not None:
            await bot_api.stop()
    bound = args.lease + args.interval
    print(f"\nworkers {args.workers}, lease {args.lease:g} s, acquisition interval {args.interval:g} s")
    print(f"{'bot':<5} {'from the SIGKILL to':<22} {'min':>6} {'median':>7} {'max':>6}")
    for bot_id in ("fwd", "rev", "tgp"):
        if bot_id not in results:
            continue
        for key, label in (
            ("lease", "a survivor's lease"),
            ("socket", "the new socket" if bot_id != "tgp" else "the survivor's poll"),
            ("answered", "a message answered"),
        ):
            s = results[bot_id]["summary"][key]
            print(f"{bot_id:<5} {label:<22} {s['min']:>6.2f} {s['median']:>7.2f} {s['max']:>6.2f}")
    print(f"stated bound (ws-forward, polling): lease + interval = {bound:g} s, plus the dial")
    if "tgp" in results:
        print(f"tgp: getUpdates conflicts seen by the stand-in (two pollers at once): {results['tgp']['conflicts']}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--lease", type=float, default=6.0)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--reverse", action="store_true", help="also a ws-reverse bot the stand-in dials")
    parser.add_argument("--telegram", action="store_true", help="also a Telegram bot on getUpdates polling")
    parser.add_argument("--run-dir", type=Path, default=None)
    sys.exit(asyncio.run(main(parser.parse_args())))
