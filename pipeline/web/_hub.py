"""Console viewers of one worker: one Redis subscription, fanned out in memory.

Every delivery to a console chat is published once on the deployment's live channel. The hub holds
the worker's only subscription to it and hands each delivery, already framed as a server-sent
event, to the viewers of that chat and no other. A viewer that falls behind (its queue is full) or
misses deliveries (the subscription was lost) is ended: the page reconnects with the last
sequence number it has and catches up from the chat's list. Status notes (held, released, merged,
dropped) travel the same way, unnumbered: a viewer that misses one does not get it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from pipeline import metrics
from pipeline.errors import SwitchboardError
from pipeline.state import ConsoleStore, LiveMessage, RedisPy, listen

log = logging.getLogger(__name__)

# Deliveries a viewer may have waiting before it counts as too slow and is ended (while its backlog
# is written), and bytes its connection may have unsent (after).
VIEWER_QUEUE = 256
VIEWER_BUFFER_BYTES = 1024 * 1024
# The subscription's read returns this often when nothing arrives (to notice a shutdown).
POLL_SECONDS = 1.0
# A stream with nothing to send gets a `: keep-alive` comment about this often.
KEEPALIVE_SECONDS = 15.0
KEEPALIVE_FRAME = b": keep-alive\n\n"


class ViewerLimit(SwitchboardError):
    """The worker already has its cap of console viewers."""


class Viewer:
    """One open console stream. Until its handler has written the backlog, deliveries of its chat
    wait in `pending`; from then on (`sink` set) each is written to its connection at once, here,
    with no task to wake: a delivery to ten viewers is ten socket writes."""

    __slots__ = ("chat", "connection", "ended", "idle", "keepalive", "last", "pending", "reason", "sink", "wake")

    def __init__(self, chat: tuple[str, str]) -> None:
        self.chat = chat
        self.pending: deque[tuple[int, bytes]] = deque()
        self.wake = asyncio.Event()
        self.ended = False
        self.reason = "client_left"
        self.idle = True  # nothing was sent since the last keep-alive tick
        self.keepalive = False  # a keep-alive comment is due (before the stream went live)
        self.last = 0  # the seq of the last message sent
        self.sink: asyncio.WriteTransport | None = None
        # Its connection, to drop when the client does not read (a write to it would wait forever).
        self.connection: asyncio.Transport | None = None

    def go_live(self, sink: asyncio.WriteTransport) -> None:
        """The backlog and `pending` are written: from now on deliveries go straight to `sink`."""
        self.sink = sink

    def tick(self) -> None:
        """The hub's keep-alive clock (one timer for every viewer, not one per wait)."""
        if self.idle:
            if self.sink is not None:
                self._write(KEEPALIVE_FRAME)
            else:
                self.keepalive = True
                self.wake.set()
        self.idle = True

    def offer(self, seq: int, frame: bytes) -> None:
        """A delivery (seq > 0, each sent once and in order) or a status note (seq 0: not numbered)."""
        if self.ended or (seq and seq <= self.last):
            return
        self.idle = False
        if self.sink is not None:
            if self._write(frame) and seq:
                self.last = seq
            return
        if len(self.pending) >= VIEWER_QUEUE:
            self.end("slow")
            return
        self.pending.append((seq, frame))
        self.wake.set()

    def _write(self, frame: bytes) -> bool:
        sink = self.sink
        assert sink is not None
        if sink.is_closing():
            self.end("client_left")
            return False
        if sink.get_write_buffer_size() > VIEWER_BUFFER_BYTES:
            self.end("slow")
            return False
        # The response is chunked (HTTP/1.1): one chunk per frame, as aiohttp's writer frames them.
        sink.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        return True

    def end(self, reason: str) -> None:
        if not self.ended:
            self.ended = True
            self.reason = reason
            self.sink = None
            if reason == "slow" and self.connection is not None:
                self.connection.abort()  # what it has not read is dropped; its page reconnects
            self.wake.set()


def sse_frame(seq: int, message: str) -> bytes:
    """A delivery as a server-sent event (its id the seq); a status note (seq 0) as a `note` event
    without an id, so a reconnecting client's `after` is never a note's."""
    if seq == 0:
        return f"event: note\ndata: {message}\n\n".encode()
    return f"id: {seq}\nevent: message\ndata: {message}\n\n".encode()


class ConsoleHub:
    def __init__(self, store: ConsoleStore, subscriber: RedisPy, max_viewers: int) -> None:
        self.store = store
        self.subscriber = subscriber  # its own connection, without retries: a break is seen here
        self.max_viewers = max_viewers
        self._chats: dict[tuple[str, str], set[Viewer]] = {}
        self._count = 0
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._closed = False
        # Set while the subscription is live: a viewer reads its chat's backlog only then, so no
        # delivery falls between the backlog and the live messages.
        self.subscribed = asyncio.Event()

    @property
    def viewers(self) -> int:
        return self._count

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="console-hub")
        self._ticker = asyncio.create_task(self._tick(), name="console-keepalive")

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_SECONDS)
            for viewers in self._chats.values():
                for viewer in viewers:
                    viewer.tick()

    async def close(self) -> None:
        """End every stream (their handlers return at once) and drop the subscription."""
        self._closed = True
        self._end_all("shutdown")
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # redis-py can absorb a cancellation inside a read (the read then returns nothing):
            # the loop also stops by itself within a poll once it sees `_closed`.
            await asyncio.wait({task}, timeout=POLL_SECONDS + 2)
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.warning("console: live subscription ended with %r", task.exception())

    def join(self, bot_id: str, chat_id: str) -> Viewer:
        if self._closed:
            raise ViewerLimit("shutting down")
        if self._count >= self.max_viewers:
            raise ViewerLimit(f"{self._count} console viewers on this worker (SWITCHBOARD_CONSOLE_MAX_VIEWERS)")
        viewer = Viewer((bot_id, chat_id))
        self._chats.setdefault(viewer.chat, set()).add(viewer)
        self._count += 1
        metrics.CONSOLE_VIEWERS.set(self._count)
        return viewer

    def leave(self, viewer: Viewer) -> None:
        viewers = self._chats.get(viewer.chat)
        if viewers is None or viewer not in viewers:
            return
        viewers.discard(viewer)
        if not viewers:
            del self._chats[viewer.chat]
        self._count -= 1
        metrics.CONSOLE_VIEWERS.set(self._count)
        metrics.CONSOLE_STREAMS_ENDED.labels(viewer.reason).inc()

    def _deliver(self, data: Any) -> None:
        try:
            live = LiveMessage.parse(data)
        except (ValueError, TypeError):
            log.warning("console: ignored a malformed live message")
            return
        viewers = self._chats.get((live.bot_id, live.chat_id))
        if not viewers:
            return
        frame = sse_frame(live.seq, live.message)
        for viewer in list(viewers):
            viewer.offer(live.seq, frame)

    def _end_all(self, reason: str) -> None:
        for viewers in self._chats.values():
            for viewer in viewers:
                viewer.end(reason)

    async def _listen(self) -> None:
        await listen(
            self.subscriber,
            self.store.channel,
            self._deliver,
            subscribed=self.subscribed,
            on_lost=self._lost,
            running=lambda: not self._closed,
            poll_seconds=POLL_SECONDS,
        )

    def _lost(self, exc: Exception) -> None:
        # Deliveries published while we were not subscribed are lost to this worker: its viewers
        # reconnect and catch up from their chats' lists.
        log.warning("console: live subscription lost (%s); resubscribing", type(exc).__name__)
        self._end_all("resync")
