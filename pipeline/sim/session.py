"""One simulated session: its event log (history), its open streams and its turn worker.

Events are emitted through :meth:`SimSession.emit`, which stamps the server fields (P1, P4), appends
the history form to the log and pushes one pre-encoded SSE frame to every open stream. Log append and
fan-out happen in the same synchronous step, so a stream sees exactly the events after it opened,
in log order (what clients rely on to resume, and P10).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pipeline.sim.settings import SimSettings

# Sentinels pushed into a stream's queue instead of a frame.
CLOSE = b"close"  # end the response cleanly (session deleted / terminated / server stopping)
DROP = b"drop"  # abort the connection mid-stream (fault injection)
PING = b"event: ping\ndata: {}\n\n"


def new_id(prefix: str = "sevt-") -> str:
    return prefix + secrets.token_hex(12)


def now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def sse_frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


def text_blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


class Subscriber:
    """One open SSE response. Kept tiny: 10,000 of these must fit in the simulator."""

    __slots__ = ("deltas", "queue")

    def __init__(self, deltas: frozenset[str]) -> None:
        self.deltas = deltas
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()


@dataclass(slots=True)
class Usage:
    active_seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    web_search_requests: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "active_seconds": round(self.active_seconds, 3),
            "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "server_tool_use": {
                "web_fetch_requests": 0,
                "web_search_requests": self.web_search_requests,
                "general_search_requests": 0,
                "visual_search_requests": 0,
            },
        }


@dataclass(slots=True)
class SimContext:
    """What every session shares with the server: settings, the seeded RNG, counters."""

    settings: SimSettings
    rng: random.Random
    stats: Counter[str] = field(default_factory=Counter)


class SimSession:
    def __init__(self, session_id: str, context: SimContext, *, agent: Any = None, environment_id: str = "") -> None:
        self.id = session_id
        self.context = context
        self.agent = agent
        self.environment_id = environment_id
        self.agent_name = context.settings.agent_name
        self.main_thread_id = new_id("sthr-")
        self.created_at = now_rfc3339()
        self.updated_at = self.created_at
        self.status = "idle"  # idle | running | terminated
        self.gone = False  # deleted
        self.log: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}
        self.subscribers: set[Subscriber] = set()
        self.usage = Usage()
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.pending_actions: dict[str, dict[str, Any] | None] = {}  # requires_action ids -> answer
        self.answered = asyncio.Event()
        self.open_span_id: str | None = None
        self.in_turn = False
        self._worker: asyncio.Task[None] | None = None
        self._turn: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ emission

    def emit(
        self,
        event_type: str,
        fields: dict[str, Any] | None = None,
        *,
        event_id: str | None = None,
        processed_at: str | None = None,
        thread_id: str | None = None,
    ) -> dict[str, Any]:
        """Record and broadcast one event. ``thread_id`` marks a sub-thread event: the stream carries
        ``session_thread_id``; history omits it on agent.* events (P8)."""
        event: dict[str, Any] = {
            "type": event_type,
            "id": event_id or new_id(),
            "processed_at": processed_at or now_rfc3339(),
        }
        if fields:
            event.update(fields)
        history_form = event
        if thread_id is not None:
            event["session_thread_id"] = thread_id
            if event_type.startswith("agent."):
                history_form = {k: v for k, v in event.items() if k != "session_thread_id"}
        self.index[event["id"]] = len(self.log)
        self.log.append(history_form)
        self.updated_at = event["processed_at"]
        self.context.stats["events_emitted"] += 1
        self._broadcast(sse_frame(event), None)
        return event

    def preview(self, event_type: str, fields: dict[str, Any], previewed_type: str) -> None:
        """A preview frame (P6): only to streams that asked for ``previewed_type``, never to history."""
        frame = {"type": event_type, "id": new_id(), "processed_at": now_rfc3339(), **fields}
        self._broadcast(sse_frame(frame), previewed_type)

    def _broadcast(self, frame: bytes, only_deltas_of: str | None) -> None:
        if not self.subscribers:
            return
        drop_prob = self.context.settings.faults.drop_stream_prob if self.in_turn else 0.0
        for sub in list(self.subscribers):
            if only_deltas_of is not None and only_deltas_of not in sub.deltas:
                continue
            if drop_prob and self.context.rng.random() < drop_prob:
                self.drop_subscriber(sub)  # dropped before this frame: the client must recover it
                continue
            sub.queue.put_nowait(frame)

    def drop_subscriber(self, sub: Subscriber) -> None:
        self.subscribers.discard(sub)
        sub.queue.put_nowait(DROP)
        self.context.stats["streams_dropped"] += 1

    def drop_all_streams(self) -> int:
        dropped = len(self.subscribers)
        for sub in list(self.subscribers):
            self.drop_subscriber(sub)
        return dropped

    def close_streams(self) -> None:
        for sub in list(self.subscribers):
            sub.queue.put_nowait(CLOSE)
        self.subscribers.clear()

    # ------------------------------------------------------------------ status helpers

    def set_running(self) -> None:
        self.status = "running"
        self.emit("session.status_running")
        self.emit(
            "session.thread_status_running",
            {"agent_name": self.agent_name, "session_thread_id": self.main_thread_id},
        )

    def go_idle(self, stop_reason: dict[str, Any]) -> str:
        """P9/P10: last thread idle, then usage (id sevt-usg-<idle id>, same processed_at), then idle."""
        self.emit(
            "session.thread_status_idle",
            {
                "agent_name": self.agent_name,
                "session_thread_id": self.main_thread_id,
                "stop_reason": stop_reason,
            },
        )
        idle_id = new_id()
        stamp = now_rfc3339()
        self.emit(
            "session.usage",
            {"usage": self.usage.snapshot()},
            event_id=f"sevt-usg-{idle_id}",
            processed_at=stamp,
        )
        self.status = "idle"
        self.emit("session.status_idle", {"stop_reason": stop_reason}, event_id=idle_id, processed_at=stamp)
        return idle_id

    def span_start(self) -> str:
        self.open_span_id = self.emit("span.model_request_start")["id"]
        return self.open_span_id

    def span_end(self, input_tokens: int = 12, output_tokens: int = 8, *, is_error: bool = False) -> None:
        if self.open_span_id is None:
            return
        self.usage.input_tokens += input_tokens
        self.usage.output_tokens += output_tokens
        self.emit(
            "span.model_request_end",
            {
                "model_request_start_id": self.open_span_id,
                "model_usage": {
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "speed": "standard",
                },
                "is_error": is_error,
            },
        )
        self.open_span_id = None

    def terminate(self) -> None:
        self.emit(
            "session.thread_status_terminated",
            {"agent_name": self.agent_name, "session_thread_id": self.main_thread_id},
        )
        self.emit("session.status_terminated")
        self.status = "terminated"
        self.close_streams()
        self._stop_worker()

    def delete(self) -> None:
        if self.gone:
            return
        self.emit("session.deleted")
        self.gone = True
        self.close_streams()
        self._stop_worker()

    # ------------------------------------------------------------------ turns

    def enqueue_message(self, message: dict[str, Any]) -> None:
        """Messages that arrive during a turn wait for it to end, as in a real session."""
        self.inbox.put_nowait(message)
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work())

    def answer(self, action_id: str, answer: dict[str, Any]) -> None:
        self.pending_actions[action_id] = answer
        self.answered.set()

    def open_action_ids(self) -> set[str]:
        return {k for k, v in self.pending_actions.items() if v is None}

    def interrupt(self) -> bool:
        """Stop the running turn; it ends with end_turn. Returns False when no turn was active."""
        turn = self._turn
        if turn is None or turn.done():
            return False
        turn.cancel()  # the turn task runs no more code: emitting the closing events here keeps order
        self.pending_actions.clear()
        self.span_end(0, 0)  # closes any preview of the request that was cut short
        self.in_turn = False
        self.go_idle({"type": "end_turn"})
        self.context.stats["interrupts"] += 1
        return True

    async def _work(self) -> None:
        from pipeline.sim.agent import run_turn  # the script depends on this module

        while True:
            message = await self.inbox.get()
            self._turn = asyncio.get_running_loop().create_task(run_turn(self, message))
            started = time.monotonic()
            self.in_turn = True
            try:
                await self._turn
            except asyncio.CancelledError:
                if self._turn.cancelled() and not _current_task_cancelling():
                    continue  # the turn was interrupted; the worker carries on
                raise
            finally:
                self.in_turn = False
                self.usage.active_seconds += time.monotonic() - started
                self._turn = None
            if self.status == "terminated" or self.gone:
                return

    def _stop_worker(self) -> None:
        current = asyncio.current_task()
        for task in (self._turn, self._worker):
            if task is not None and task is not current and not task.done():
                task.cancel()

    def stop(self) -> None:
        self.close_streams()
        self._stop_worker()


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return bool(task is not None and task.cancelling())
