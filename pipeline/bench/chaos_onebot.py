"""The chaos bench's long-connection lane: a OneBot v11 bot on reverse WebSocket under the same faults.

A stand-in implementation (`onebot_peer`) dials the running workers in turn (a load balancer) and
sends private messages `ob<n>` to the bot `napcat` (busy policy `queue`: every message its own
turn), a few chats round robin. When a SIGKILL takes the worker holding the socket, the stand-in
reconnects to another one, which takes the lease. Accounting: every message the stand-in wrote to an
open socket must be answered exactly once (`echo: ob<n>`). OneBot v11 acknowledges nothing, so a
frame written into the socket of a worker killed before it read it is lost by the protocol: such a
message (unanswered, its socket closed within `_DEAD_SOCKET_MS` of the write) is counted apart, as
`lost_in_dead_socket`, not as `lost`. The same holds the other way: a reply whose action was written
by a holder killed before the answer is not sent again (it may have been posted; egress
dead-letters it `outcome_unknown`); such a message is counted `outcome_unknown`, read from the
dead-letter topic, not `lost`. An answer that came more than `late_after` seconds after the
write is counted `late` (answered, but slowly: the run waits for it rather than calling it lost).
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer

from pipeline.records import DeadLetter
from pipeline.topics import DEADLETTER

from .onebot_peer import Action, OneBotPeer, Socket

BOT_ID = "napcat"
TOKEN = "chaos-onebot-access-token"
SELF_ID = 10001000
BOT_TOML = f"""
[[bots]]
platform = "onebot"
bot_id = "{BOT_ID}"
self_id = "{SELF_ID}"
transport = "ws-reverse"
language = "en"
busy_policy = "queue"
credentials = {{ access_token = "{TOKEN}" }}
"""
_TOKEN = re.compile(r"\bob(\d+)\b")
# A frame written this shortly before its socket closed may never have been read by the worker.
_DEAD_SOCKET_MS = 1000.0


@dataclass
class Written:
    n: int
    socket: int
    at: float  # time.monotonic() of the write


@dataclass
class OneBotLane:
    rate: float
    chats: int = 5
    peer: OneBotPeer = field(init=False)
    sent: int = 0
    _task: asyncio.Task[None] | None = None
    _stop: bool = False

    def __post_init__(self) -> None:
        self.peer = OneBotPeer(self_id=SELF_ID, access_token=TOKEN, heartbeat_interval=5.0, reconnect_interval=0.5)

    def start(self, worker_urls: Callable[[], list[str]]) -> None:
        self.peer.dial(lambda: [u.replace("http://", "ws://") + f"/onebot/ws/{BOT_ID}" for u in worker_urls()])
        self._task = asyncio.create_task(self._traffic())

    async def _traffic(self) -> None:
        await self.peer.wait_until(lambda: bool(self.peer.open_sockets()), 60, "the stand-in connected")
        start = time.monotonic()
        while not self._stop:
            self.sent += 1
            n = self.sent
            user = 80_000 + n % self.chats
            text = f"ob{n}"
            await self.peer.send_event(
                {
                    "time": int(time.time()),
                    "self_id": SELF_ID,
                    "post_type": "message",
                    "message_type": "private",
                    "sub_type": "friend",
                    "message_id": 200_000 + n,
                    "user_id": user,
                    "message": [{"type": "text", "data": {"text": text}}],
                    "raw_message": text,
                    "font": 0,
                    "sender": {"user_id": user, "nickname": f"u{user}"},
                }
            )
            await asyncio.sleep(max(0.0, start + n / self.rate - time.monotonic()))

    async def stop_traffic(self) -> None:
        self._stop = True
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def close(self) -> None:
        await self.stop_traffic()
        await self.peer.stop()

    def written(self) -> list[Written]:
        out = []
        for event, socket, at in self.peer.delivered:
            match = _TOKEN.search(event["raw_message"])
            if match:
                out.append(Written(int(match.group(1)), socket, at))
        return out

    def unanswered(self) -> int:
        answered = {n for n, count in answers(self.peer.replies()).items() if count}
        return sum(1 for w in self.written() if w.n not in answered)

    def replies_received(self) -> int:
        return len(self.peer.replies())

    def account(
        self, *, late_after: float = 30.0, outcome_unknown: set[int] | None = None, noticed: set[int] | None = None
    ) -> dict[str, Any]:
        return account_onebot(
            self.sent,
            self.written(),
            self.peer.replies(),
            self.peer.sockets,
            late_after=late_after,
            outcome_unknown=outcome_unknown,
            noticed=noticed,
        )


async def dead_lettered_outcome_unknown(bootstrap: str, topic: str = DEADLETTER) -> set[int]:
    """Message numbers whose reply egress dead-lettered `outcome_unknown` (the dead-letter topic,
    read from the beginning to its end)."""
    return await dead_lettered_numbers(bootstrap, "egress", "outcome_unknown", topic)


async def dead_lettered_by_the_session_api(bootstrap: str, topic: str = DEADLETTER) -> set[int]:
    """Message numbers whose turn the session API refused after the client's retries (the chaos
    run's injected 429s and 500s): dispatch dead-letters the command `session_api_error` and tells
    the chat with a notice (`overloaded`, `provider_error`) instead of an answer."""
    return await dead_lettered_numbers(bootstrap, "dispatch", "session_api_error", topic)


async def dead_lettered_numbers(bootstrap: str, stage: str, reason: str, topic: str = DEADLETTER) -> set[int]:
    """Message numbers (`ob<n>`) in the OneBot bot's dead letters of `stage` and `reason`."""
    # Subscribed without a group: every partition is assigned once the topic's metadata is in.
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    found: set[int] = set()
    try:
        deadline = time.monotonic() + 10.0
        while not consumer.assignment() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # the metadata arrives on the consumer's own task
        partitions = sorted(consumer.assignment())
        end = await consumer.end_offsets(partitions) if partitions else {}
        while [tp for tp in partitions if await consumer.position(tp) < end[tp]]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                for record in records:
                    letter = DeadLetter.model_validate_json(record.value or b"{}")
                    if letter.stage == stage and letter.reason == reason and BOT_ID in letter.record:
                        found.update(int(n) for n in _TOKEN.findall(letter.record))
    finally:
        await consumer.stop()
    return found


def answers(replies: list[Action]) -> Counter[int]:
    """Accepted replies per message number, from the `echo: ob<n>` they carry."""
    return Counter(n for n, _ in _answer_times(replies))


def _answer_times(replies: list[Action]) -> list[tuple[int, float]]:
    """(message number, time.monotonic() the stand-in accepted the reply) per answer."""
    out: list[tuple[int, float]] = []
    for action in replies:
        text = "".join(s["data"].get("text", "") for s in action.params.get("message", []) if s["type"] == "text")
        out.extend((int(token), action.at) for token in _TOKEN.findall(text))
    return out


def account_onebot(
    sent: int,
    written: list[Written],
    replies: list[Action],
    sockets: list[Socket],
    *,
    late_after: float = 30.0,
    outcome_unknown: set[int] | None = None,
    noticed: set[int] | None = None,
) -> dict[str, Any]:
    """Exactly one answer per message written to an open socket; a message whose turn the session
    API refused after retries is answered by a notice (`noticed`), not lost."""
    dead_lettered = outcome_unknown or set()
    told = noticed or set()
    times = _answer_times(replies)
    counts = Counter(n for n, _ in times)
    first_answer: dict[int, float] = {}
    for n, at in times:
        first_answer[n] = min(at, first_answer.get(n, at))
    closed_at = {s.id: s.closed for s in sockets}
    lost, lost_in_dead_socket, duplicated, late, unknown, by_notice = [], [], [], [], [], []
    latencies: list[float] = []
    for w in written:
        got = counts.get(w.n, 0)
        if got > 1:
            duplicated.append(w.n)
        if got:
            latency = max(0.0, first_answer[w.n] - w.at)
            latencies.append(latency)
            if latency > late_after:
                late.append(w.n)
            continue
        closed = closed_at.get(w.socket)
        if w.n in dead_lettered:
            unknown.append(w.n)
        elif w.n in told:
            by_notice.append(w.n)
        elif closed is not None and (closed - w.at) * 1000 <= _DEAD_SOCKET_MS:
            lost_in_dead_socket.append(w.n)
        else:
            lost.append(w.n)
    gaps = []
    ordered = sorted(sockets, key=lambda s: s.opened)
    for before, after in itertools.pairwise(ordered):
        if before.closed is not None:
            gaps.append(round(max(0.0, after.opened - before.closed), 2))
    return {
        "messages_sent": sent,
        "written_to_a_socket": len(written),
        "answered": sum(1 for w in written if counts.get(w.n)),
        "lost": len(lost),
        "lost_ids": lost[:100],
        "lost_in_dead_socket": len(lost_in_dead_socket),
        "lost_in_dead_socket_ids": lost_in_dead_socket[:100],
        "outcome_unknown": len(unknown),
        "outcome_unknown_ids": unknown[:100],
        "answered_by_notice": len(by_notice),
        "answered_by_notice_ids": by_notice[:100],
        "duplicated": len(duplicated),
        "duplicated_ids": duplicated[:100],
        "late": len(late),
        "late_after_s": late_after,
        "late_ids": late[:100],
        "answer_latency_ms": _percentiles(latencies),
        "sockets": len(sockets),
        "reconnect_gaps_s": gaps,
    }


def _percentiles(seconds: list[float]) -> dict[str, int]:
    if not seconds:
        return {}
    ordered = sorted(seconds)

    def at(q: float) -> int:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000)

    return {"p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1] * 1000)}


__all__ = [
    "BOT_TOML",
    "OneBotLane",
    "Written",
    "account_onebot",
    "answers",
    "dead_lettered_by_the_session_api",
    "dead_lettered_outcome_unknown",
]
