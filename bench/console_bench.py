"""Console viewers against the pipeline: do open console tabs slow it down, and what does each
delivery cost in Redis traffic as viewers are added?

    .venv/bin/python bench/console_bench.py [--viewers 1000] [--chats 100] [--duration 20]
                                            [--deliveries 50] [--history 50] [--rounds 2]

Starts a local stack (Tansu, Redis, the simulator with think 0, one worker), a console bot with a
token, and prints:

* the pipeline's messages/s with 0 and with `--viewers` console streams open (10 per chat on the
  loaded chats, held by a separate process): `--chats` private chats, each sending its next message
  as soon as its reply is delivered (closed loop) for `--duration` seconds, the two phases
  alternated `--rounds` times; worker CPU per message; Redis connections while the viewers are open;
* Redis bytes per delivery (INFO stats total_net_input_bytes + total_net_output_bytes, before and
  after `--deliveries` sequential turns into one chat that already holds `--history` messages) with
  0, 1 and 100 viewers of that chat. The bench's own pattern subscription (how it sees replies) is
  subtracted: the RESP size of every message it received.

Replies are seen on the deployment's live channel (a pattern subscription also matching the
per-bot channels of earlier versions, so the same script measures an older checkout too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import aiohttp
import redis.asyncio as aioredis

from pipeline.embedded import free_port
from pipeline.stack import Stack

BOT = "bench"
TOKEN = "console-bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BOTS_TOML = f"""
[[bots]]
platform = "console"
bot_id = "{BOT}"
self_id = "bot"
language = "en"
busy_policy = "queue"
credentials = {{ token = "{TOKEN}" }}
"""


# -- the viewers' process ----------------------------------------------------------------------------
def _viewers_main(url: str, chats: list[str], count: int, pipe: Connection) -> None:
    asyncio.run(_viewers(url, chats, count, pipe))


async def _viewers(url: str, chats: list[str], count: int, pipe: Connection) -> None:
    connected = 0
    refused = 0
    events = 0
    stop = asyncio.Event()

    async def view(http: aiohttp.ClientSession, chat: str) -> None:
        nonlocal connected, refused, events
        params = {"chat_id": chat, "bot_id": BOT, "after": "0"}
        try:
            async with http.get(f"{url}/console/api/stream", params=params, headers=AUTH) as response:
                if response.status != 200:
                    refused += 1
                    return
                connected += 1
                async for line in response.content:
                    if line.startswith(b"data:"):
                        events += 1
        except (TimeoutError, aiohttp.ClientError):
            refused += 1

    timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as http:
        tasks = [asyncio.create_task(view(http, chats[i % len(chats)])) for i in range(count)]
        loop = asyncio.get_running_loop()
        loop.add_reader(pipe.fileno(), stop.set)
        while not stop.is_set():
            pipe.send(("status", connected, refused, events))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await stop.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    pipe.recv()
    pipe.send(("done", connected, refused, events))


class Viewers:
    """`count` console streams held by a child process (so reading them costs this process nothing)."""

    def __init__(self, url: str, chats: list[str], count: int) -> None:
        self.count = count
        self._pipe, child = multiprocessing.get_context("spawn").Pipe()
        self._process = multiprocessing.get_context("spawn").Process(
            target=_viewers_main, args=(url, chats, count, child), daemon=True
        )
        self.status: tuple[int, int, int] = (0, 0, 0)

    def cpu_seconds(self) -> float:
        assert self._process.pid is not None
        return _process_cpu(self._process.pid)

    def _drain(self) -> None:
        with contextlib.suppress(EOFError):  # the process ended
            while self._pipe.poll():
                _, connected, refused, events = self._pipe.recv()
                self.status = (connected, refused, events)

    async def start(self, within: float = 60.0) -> None:
        """Until every stream answered and the backlogs they were sent on connecting are read
        (the load phase measures viewers that are open, not viewers that are connecting)."""
        self._process.start()
        deadline = time.monotonic() + within
        last_events, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            self._drain()
            connected, refused, events = self.status
            if events != last_events:
                last_events, quiet_since = events, time.monotonic()
            if connected + refused >= self.count and time.monotonic() - quiet_since >= 1.0:
                return
            await asyncio.sleep(0.2)

    async def stop(self) -> tuple[int, int, int]:
        self._pipe.send("stop")
        deadline = time.monotonic() + 20
        while self._process.is_alive() and time.monotonic() < deadline:
            self._drain()
            await asyncio.sleep(0.1)
        self._drain()
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()
        return self.status


# -- replies, seen on the live channel ---------------------------------------------------------------
class Replies:
    """Every console delivery, by chat; and the bytes Redis sent us for them."""

    def __init__(self, redis: aioredis.Redis, prefix: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.waiters: dict[str, asyncio.Event] = {}
        self.delivered = 0
        self.bytes_received = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        pattern = f"{self.prefix}console-live*"
        pubsub = self.redis.pubsub()
        await pubsub.psubscribe(pattern)

        async def loop() -> None:
            async for message in pubsub.listen():
                if message["type"] != "pmessage":
                    continue
                channel, data = message["channel"], message["data"]
                # What Redis wrote for it: *4 pmessage <pattern> <channel> <data> in RESP.
                self.bytes_received += sum(len(_bulk(x)) for x in ("pmessage", pattern, channel, data)) + 4
                if channel == f"{self.prefix}console-live":  # this version: "[bot, chat, seq]\n<message>"
                    chat = json.loads(data.partition("\n")[0])[1]
                else:  # earlier versions: one channel per bot, the chat id as the message
                    chat = data
                self.delivered += 1
                waiter = self.waiters.get(chat)
                if waiter is not None:
                    waiter.set()

        self._task = asyncio.create_task(loop())

    def expect(self, chat: str) -> asyncio.Event:
        event = asyncio.Event()
        self.waiters[chat] = event
        return event

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _bulk(value: str) -> bytes:
    raw = value.encode()
    return b"$%d\r\n" % len(raw) + raw + b"\r\n"


# -- the measurements ---------------------------------------------------------------------------------
async def turn(http: aiohttp.ClientSession, url: str, replies: Replies, chat: str, text: str) -> bool:
    """One message into a chat and its reply delivered (False on a refusal or after 15 s)."""
    arrived = replies.expect(chat)
    body = {"chat_id": chat, "chat_type": "private", "user_id": "u1", "user_name": "Bench", "text": text}
    try:
        async with http.post(f"{url}/webhooks/console/{BOT}", json=body, headers=AUTH) as response:
            if response.status != 200:
                return False
        async with asyncio.timeout(15):
            await arrived.wait()
    except (aiohttp.ClientError, TimeoutError):
        return False
    return True


async def throughput(url: str, replies: Replies, chats: list[str], seconds: float, pid: int) -> dict[str, float]:
    done = failed = 0
    stop_at = time.monotonic() + seconds
    cpu0 = _process_cpu(pid)

    async def chat_loop(http: aiohttp.ClientSession, chat: str) -> None:
        nonlocal done, failed
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            if await turn(http, url, replies, chat, f"message {n}"):
                done += 1
            else:
                failed += 1

    started = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(chat_loop(http, c) for c in chats))
    wall = time.monotonic() - started
    cpu = _process_cpu(pid) - cpu0
    return {
        "messages_per_s": done / wall,
        "wall_s": wall,
        "failed": failed,
        "worker_cpu_ms_per_message": cpu * 1000 / done if done else float("nan"),
    }


async def bytes_per_delivery(
    url: str, redis: aioredis.Redis, replies: Replies, chat: str, deliveries: int
) -> tuple[float, int]:
    async with aiohttp.ClientSession() as http:
        before = await redis.info("stats")
        received0 = replies.bytes_received
        ok = 0
        for n in range(deliveries):
            ok += await turn(http, url, replies, chat, f"measured {n}")
        after = await redis.info("stats")
    total = sum(after[k] - before[k] for k in ("total_net_input_bytes", "total_net_output_bytes"))
    own = replies.bytes_received - received0
    return (total - own) / max(ok, 1), ok


def _process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def worker_viewers_gauge(url: str) -> float | None:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith("switchboard_console_viewers "):
                return float(line.split()[1])
    return None


async def redis_clients(redis: aioredis.Redis) -> int:
    return int((await redis.info("clients"))["connected_clients"])


async def settle_clients(redis: aioredis.Redis, baseline: int, within: float = 60.0) -> float:
    """Seconds until the worker's Redis connections are back near `baseline` after viewers left
    (a server that holds a connection per viewer keeps them until it notices): the next phase
    must not pay for the last one's viewers."""
    started = time.monotonic()
    for _ in range(int(within / 0.5)):
        if await redis_clients(redis) <= baseline + 50:  # the pipeline's own pool grows a little under load
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


@contextlib.contextmanager
def clean_environment() -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_")}
    for key in saved:
        del os.environ[key]
    try:
        yield
    finally:
        os.environ.update(saved)


async def with_viewers(
    args: argparse.Namespace, url: str, redis: aioredis.Redis, replies: Replies, chats: list[str], pid: int
) -> dict[str, Any]:
    """The closed-loop load with `args.viewers` console streams open on the loaded chats."""
    clients_before = await redis_clients(redis)
    viewers = Viewers(url, chats, args.viewers)
    await viewers.start()
    connected, refused, _ = viewers.status
    clients = await redis_clients(redis)
    gauge = await worker_viewers_gauge(url)
    print(
        f"{args.viewers} viewers: {connected} connected, {refused} refused or broken; worker gauge {gauge}; "
        f"Redis connected_clients {clients}",
        flush=True,
    )
    viewer_cpu = viewers.cpu_seconds()
    loaded = await throughput(url, replies, chats, args.duration, pid)
    viewer_cpu = viewers.cpu_seconds() - viewer_cpu
    clients_during = await redis_clients(redis)
    connected, refused, events = await viewers.stop()
    settled = await settle_clients(redis, clients_before)
    print(
        f"{args.viewers} viewers:  {loaded['messages_per_s']:7.1f} messages/s  "
        f"({loaded['worker_cpu_ms_per_message']:.2f} ms worker CPU/message, {loaded['failed']} failed); "
        f"viewers received {events} events; Redis connected_clients after the load {clients_during}, "
        f"{settled:.1f} s after the viewers left back to {clients_before}; the viewers' own process used "
        f"{viewer_cpu / loaded['wall_s']:.0%} of a core (the same 2 cores as the pipeline)",
        flush=True,
    )
    return {
        **loaded,
        "connected": connected,
        "refused": refused,
        "events": events,
        "redis_clients": clients,
        "worker_gauge": gauge,
        "viewer_process_cpu_s": viewer_cpu,
    }


async def main(args: argparse.Namespace) -> None:
    run_dir = Path(tempfile.mkdtemp(prefix="sb-console-bench-"))
    (run_dir / "bots.toml").write_text(BOTS_TOML)
    env = {
        "SWITCHBOARD_CONFIG": str(run_dir / "bots.toml"),
        "SWITCHBOARD_CONSOLE_ENABLED": "true",
        "SWITCHBOARD_CONSOLE_MAX_VIEWERS": str(args.viewers + 200),
        "SWITCHBOARD_WEB_MAX_CONNECTIONS": str(args.viewers + 2000),
        "SWITCHBOARD_LOG_LEVEL": "WARNING",
    }
    stack = Stack(settings_env=env, web_port=free_port(), think=0.0, run_dir=run_dir)
    with clean_environment():
        await stack.start()
    worker = stack.workers[0]
    assert worker.pid is not None
    url = worker.url
    settings = stack.settings()
    redis = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    replies = Replies(redis, settings.redis_prefix)
    await replies.start()
    chats = [f"load-{i}" for i in range(args.chats)]
    results: dict[str, Any] = {"viewers": args.viewers, "chats": args.chats, "duration_s": args.duration}
    try:
        async with aiohttp.ClientSession() as http:  # every chat's session exists before measuring
            warm = await asyncio.gather(*(turn(http, url, replies, c, "warm-up") for c in chats))
        print(f"warm-up: {sum(warm)}/{len(chats)} chats answered", flush=True)

        results["no_viewers"], results["with_viewers"] = [], []
        for _ in range(args.rounds):  # alternated: the machine's other load drifts between phases
            base = await throughput(url, replies, chats, args.duration, worker.pid)
            print(
                f"0 viewers:     {base['messages_per_s']:7.1f} messages/s  "
                f"({base['worker_cpu_ms_per_message']:.2f} ms worker CPU/message, {base['failed']} failed)",
                flush=True,
            )
            results["no_viewers"].append(base)
            results["with_viewers"].append(await with_viewers(args, url, redis, replies, chats, worker.pid))
        for key in ("no_viewers", "with_viewers"):
            rates = [r["messages_per_s"] for r in results[key]]
            cpu = [r["worker_cpu_ms_per_message"] for r in results[key]]
            print(
                f"mean, {key.replace('_', ' ')}: {sum(rates) / len(rates):.1f} messages/s, "
                f"{sum(cpu) / len(cpu):.2f} ms worker CPU/message",
                flush=True,
            )
        clients_before = await redis_clients(redis)

        chat = "bytes-chat"
        async with aiohttp.ClientSession() as http:
            for n in range(args.history):
                await turn(http, url, replies, chat, f"history {n}")
        results["bytes_per_delivery"] = {}
        for count in (0, 1, 100):
            holder = Viewers(url, [chat], count) if count else None
            if holder is not None:
                await holder.start()
            per, ok = await bytes_per_delivery(url, redis, replies, chat, args.deliveries)
            if holder is not None:
                await holder.stop()
                await settle_clients(redis, clients_before)
            results["bytes_per_delivery"][count] = per
            print(
                f"Redis bytes per delivery, {count:3d} viewer(s) of the chat: {per:10,.0f}  ({ok} deliveries, "
                f"chat of {args.history}+ messages)",
                flush=True,
            )
    finally:
        await replies.stop()
        await redis.aclose()
        await stack.stop()
        shutil.rmtree(run_dir, ignore_errors=True)
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--viewers", type=int, default=1000)
    parser.add_argument("--chats", type=int, default=100)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--deliveries", type=int, default=50)
    parser.add_argument("--history", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="alternated 0-viewer / N-viewer load phases")
    asyncio.run(main(parser.parse_args()))
