"""Open-loop webhook load through the real ingress, and what the console platform delivered.

The generator runs in its own thread (own event loop, a minimal keep-alive HTTP client, bodies
serialised before the clock starts) so its CPU can be measured on its own. Sends are scheduled at
fixed times and fired whether or not earlier requests have been answered (open loop: a slow pipeline
shows up as latency, not as a lower offered rate); latencies are taken from the *intended* send time.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.bench._http import KeepAliveClient
from pipeline.bench.measure import ThreadCpu, summary
from pipeline.state import Keys

STAGES = ("ingress", "ingest", "dispatch_in", "dispatch", "stream", "render", "delivered")
TOKEN_RE = re.compile(r"\bmsg:([A-Za-z0-9_-]+)")


@dataclass
class TrafficMix:
    conversations: int = 200
    private_share: float = 0.3  # share of conversations that are private chats (every message triggers)
    filtered_share: float = 0.8  # share of group messages that do not trigger (no @mention)
    burst_prob: float = 0.02  # probability that an arrival is a burst of `burst_size` messages into one chat
    burst_size: int = 5
    bot: str = "demo"
    think: float | None = None  # per-message `[sim:think=S]`; None: the simulator's default
    text_bytes: int = 40
    users_per_chat: int = 5
    chat_prefix: str = ""


@dataclass(slots=True)
class Sent:
    msg_id: str
    chat_id: str
    chat_type: str
    triggers: bool
    intended_ms: float
    body: bytes
    acked_ms: float = 0.0
    status: int = 0
    attempts: int = 0


@dataclass
class Plan:
    messages: list[Sent]
    offsets: list[float]  # seconds after the start, per message
    chats: list[tuple[str, str]]  # (chat_id, chat_type)
    bot: str
    run_id: str


def build_plan(mix: TrafficMix, rate: float, duration: float, *, seed: int = 1, run_id: str | None = None) -> Plan:
    rng = random.Random(seed)
    run_id = run_id or uuid.uuid4().hex[:6]
    prefix = mix.chat_prefix or f"b{run_id}"
    n_private = round(mix.conversations * mix.private_share)
    chats = [
        (f"{prefix}-{'p' if i < n_private else 'g'}{i}", "private" if i < n_private else "group")
        for i in range(mix.conversations)
    ]
    total = max(1, int(rate * duration))
    messages: list[Sent] = []
    offsets: list[float] = []
    pad = "x" * max(0, mix.text_bytes - 20)
    think = f" [sim:think={mix.think:g}]" if mix.think is not None else ""
    i = 0
    while i < total:
        at = i / rate
        chat_id, chat_type = chats[rng.randrange(len(chats))]
        count = mix.burst_size if rng.random() < mix.burst_prob else 1
        for _ in range(min(count, total - i)):
            msg_id = f"{run_id}-{i}"
            triggers = chat_type == "private" or rng.random() >= mix.filtered_share
            user = f"u{rng.randrange(mix.users_per_chat)}"
            body: dict[str, Any] = {
                "chat_id": chat_id,
                "chat_type": chat_type,
                "user_id": user,
                "user_name": user.upper(),
                "text": f"msg:{msg_id} {pad}{think}",
                "message_id": msg_id,
            }
            if chat_type == "group" and triggers:
                body["mentions"] = ["bot"]
            messages.append(Sent(msg_id, chat_id, chat_type, triggers, 0.0, json.dumps(body).encode()))
            offsets.append(at)
            i += 1
    return Plan(messages, offsets, chats, mix.bot, run_id)


@dataclass
class GeneratorStats:
    sent: int = 0
    acked: int = 0
    errors: int = 0  # requests that failed (each retry counts)
    failed: int = 0  # messages never accepted
    behind_max_ms: float = 0.0  # how late the scheduler fired (generator saturation)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    done: bool = False


class Generator:
    """Fires a plan at the ingress from a dedicated thread. `urls` is read on every send (chaos
    tests swap workers); a refused/failed webhook is retried with the same body, as platforms do.
    `schedule`, when given, replaces the plan's messages: (message, seconds after the start) pairs
    read lazily from the generator's thread, so a long run never holds all of its messages."""

    def __init__(
        self,
        plan: Plan,
        urls: Callable[[], Sequence[str]],
        *,
        retries: int = 20,
        retry_delay: float = 0.5,
        connections: int = 256,
        timeout: float = 30.0,
        schedule: Iterable[tuple[Sent, float]] | None = None,
    ) -> None:
        self.plan = plan
        self.schedule = schedule
        self.urls = urls
        self.retries = retries
        self.retry_delay = retry_delay
        self.connections = connections
        self.timeout = timeout
        self.stats = GeneratorStats()
        self.start_epoch_ms = 0.0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="bench-generator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    async def wait(self) -> GeneratorStats:
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        return self.stats

    async def _main(self) -> None:
        cpu = ThreadCpu()
        c0 = cpu.seconds()
        t_wall = time.monotonic()
        http = KeepAliveClient(limit=self.connections, headers={"Content-Type": "application/json"})
        pending: set[asyncio.Task[None]] = set()
        stats = self.stats

        async def post(sent: Sent) -> None:
            for attempt in range(self.retries + 1):
                urls = self.urls()
                url = urls[attempt % len(urls)] if urls else ""
                sent.attempts += 1
                try:
                    async with asyncio.timeout(self.timeout):
                        status = await http.post(f"{url}/webhooks/console/{self.plan.bot}", sent.body)
                    sent.status = status
                    if status == 200:
                        sent.acked_ms = time.time() * 1000
                        stats.acked += 1
                        return
                except (TimeoutError, OSError, ValueError):  # ValueError: no worker URL right now
                    sent.status = -1
                stats.errors += 1
                if self._stop.is_set() and attempt >= 2:
                    break
                await asyncio.sleep(self.retry_delay)
            stats.failed += 1

        try:
            start = time.monotonic()
            self.start_epoch_ms = time.time() * 1000 - (time.monotonic() - start) * 1000
            schedule = self.schedule
            if schedule is None:
                schedule = zip(self.plan.messages, self.plan.offsets, strict=True)
            for sent, offset in schedule:
                if self._stop.is_set():
                    break
                delay = start + offset - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    stats.behind_max_ms = max(stats.behind_max_ms, -delay * 1000)
                sent.intended_ms = self.start_epoch_ms + offset * 1000
                stats.sent += 1
                task = asyncio.create_task(post(sent))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        finally:
            await http.close()
        stats.cpu_seconds = cpu.seconds() - c0
        stats.wall_seconds = time.monotonic() - t_wall
        stats.done = True


# ---------------------------------------------------------------------------- deliveries


@dataclass
class Delivery:
    chat_id: str
    kind: str
    reply_to: str | None
    text: str
    hops: dict[str, float]
    delivered_at: float
    outbound_id: str

    @property
    def tokens(self) -> list[str]:
        return TOKEN_RE.findall(self.text)


async def read_deliveries(redis: Any, keys: Keys, bot: str, chat_ids: Sequence[str]) -> list[Delivery]:
    out: list[Delivery] = []
    chat_ids = list(chat_ids)
    for start in range(0, len(chat_ids), 500):
        chunk = chat_ids[start : start + 500]
        async with redis.pipeline(transaction=False) as pipe:
            for chat in chunk:
                pipe.lrange(keys.scoped("console", f"{bot}:{chat}"), 0, -1)
            results = await pipe.execute()
        for chat, raw_list in zip(chunk, results, strict=True):
            out += [parse_delivery(chat, raw) for raw in raw_list]
    return out


def parse_delivery(chat_id: str, raw: str | bytes, *, keep_text: bool = True) -> Delivery:
    """One console delivery as stored (and published on the live channel). `keep_text=False` drops
    the reply's text (only the tokens need it), for a reader that holds many deliveries at once."""
    d = json.loads(raw)
    text = ""
    if keep_text:
        text = "".join(s.get("data", {}).get("text", "") for s in d.get("segments", []) if s.get("type") == "text")
    return Delivery(
        chat_id=chat_id,
        kind=str(d.get("kind")),
        reply_to=d.get("reply_to"),
        text=text,
        hops={k: float(v) for k, v in (d.get("hops") or {}).items()},
        delivered_at=float(d.get("delivered_at") or 0.0),
        outbound_id=str(d.get("id")),
    )


@dataclass
class LatencyReport:
    end_to_end: dict[str, Any] = field(default_factory=dict)
    client_end_to_end: dict[str, Any] = field(default_factory=dict)
    agent: dict[str, Any] = field(default_factory=dict)
    overhead: dict[str, Any] = field(default_factory=dict)
    # Held behind the chat's running turn (busy policy), and the overhead without that wait.
    busy_wait: dict[str, Any] = field(default_factory=dict)
    overhead_excluding_busy_wait: dict[str, Any] = field(default_factory=dict)
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    ingress_ack: dict[str, Any] = field(default_factory=dict)


def latency_report(deliveries: Sequence[Delivery], sent_by_id: dict[str, Sent]) -> LatencyReport:
    e2e: list[float] = []
    client: list[float] = []
    agent: list[float] = []
    overhead: list[float] = []
    busy_wait: list[float] = []
    overhead_own: list[float] = []
    stages: dict[str, list[float]] = {f"{a}->{b}": [] for a, b in itertools.pairwise(STAGES)}
    for d in deliveries:
        if d.kind != "reply":
            continue
        hops = dict(d.hops)
        hops["delivered"] = d.delivered_at
        if "ingress" not in hops:
            continue
        total = d.delivered_at - hops["ingress"]
        e2e.append(total)
        if "stream" in hops and "dispatch" in hops:
            a = hops["stream"] - hops["dispatch"]
            agent.append(a)
            overhead.append(total - a)
            wait = hops["released"] - hops["held"] if "held" in hops and "released" in hops else 0.0
            if wait:
                busy_wait.append(wait)
            overhead_own.append(total - a - wait)
        for a_name, b_name in itertools.pairwise(STAGES):
            if a_name in hops and b_name in hops:
                stages[f"{a_name}->{b_name}"].append(hops[b_name] - hops[a_name])
        sent = sent_by_id.get(d.reply_to or "")
        if sent is not None and sent.intended_ms:
            client.append(d.delivered_at - sent.intended_ms)
    acks = [s.acked_ms - s.intended_ms for s in sent_by_id.values() if s.acked_ms and s.intended_ms]
    return LatencyReport(
        end_to_end=summary(e2e),
        client_end_to_end=summary(client),
        agent=summary(agent),
        overhead=summary(overhead),
        busy_wait=summary(busy_wait),
        overhead_excluding_busy_wait=summary(overhead_own),
        stages={k: summary(v) for k, v in stages.items()},
        ingress_ack=summary(acks),
    )


def series(deliveries: Sequence[Delivery], t0_ms: float) -> list[tuple[float, float, float]]:
    """(seconds since t0, end-to-end ms, overhead ms) per reply, for the chart."""
    out = []
    for d in deliveries:
        if d.kind != "reply" or "ingress" not in d.hops:
            continue
        total = d.delivered_at - d.hops["ingress"]
        agent = d.hops.get("stream", 0) - d.hops.get("dispatch", 0) if "stream" in d.hops else 0.0
        out.append(((d.delivered_at - t0_ms) / 1000, total, total - agent))
    out.sort()
    return out
