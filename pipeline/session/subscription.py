"""Resumable subscription to a session's events.

Resume algorithm (docs/session-protocol.md, "Transport"): open the stream first, then read history after the cursor,
then consume the stream, skipping the ids the history already delivered. The stream delivers events
in server order, so its overlap with that history read is a prefix: the first stream event not in
the history read ends the overlap and the id set is dropped. Per-subscription memory is therefore
the cursor, a few open previews and, only right after a (re)connect, at most ``dedup_window`` ids.

Server order is kept as received; nothing is sorted or de-duplicated by ``processed_at`` (P10).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar, cast

import httpx

from pipeline.session.exceptions import (
    ProtocolError,
    RateLimitedError,
    ServerError,
    TransportError,
)
from pipeline.session.models import (
    PREVIEW_TYPES,
    TERMINAL_TYPES,
    EventDelta,
    EventStart,
    ServerEvent,
    UnparsedEvent,
)
from pipeline.session.previews import Preview, PreviewAccumulator

if TYPE_CHECKING:
    from pipeline.session.client import SessionClient

log = logging.getLogger(__name__)

SubscriptionItem = ServerEvent | UnparsedEvent | Preview
# The events a subscription yields: `ServerEvent`, or with `parse` `ServerEvent | UnparsedEvent`.
E = TypeVar("E", bound=ServerEvent | UnparsedEvent)

# Failures after which the subscription reconnects; anything else (auth, 404, 400) is raised.
_RECONNECTABLE = (TransportError, ServerError, RateLimitedError, ProtocolError, httpx.HTTPError)


class Subscription(Generic[E]):
    """``async for item in client.subscribe(sid, after=cursor, deltas=True)``.

    Yields every server event once, in server order, and (when ``deltas``) :class:`Preview` snapshots
    as preview frames arrive; the final ``agent.message`` then replaces its preview. Ends after
    ``session.deleted`` or ``session.status_terminated``. ``cursor`` is the id of the last event handed
    out: persist it after processing and resume elsewhere with ``subscribe(sid, after=cursor)``.
    ``after=None`` starts from the beginning of the session's history.
    """

    def __init__(
        self,
        client: SessionClient,
        session_id: str,
        *,
        after: str | None = None,
        deltas: bool | Sequence[str] = False,
        reconnect_base: float = 0.1,
        reconnect_max: float = 5.0,
        max_reconnects: int | None = None,
        dedup_window: int = 512,
        rng: random.Random | None = None,
        parse: frozenset[str] | None = None,
    ) -> None:
        self._client = client
        self.session_id = session_id
        self._cursor = after
        if deltas is True:
            self._delta_types: tuple[str, ...] = ("agent.message",)
        elif deltas is False:
            self._delta_types = ()
        else:
            self._delta_types = tuple(deltas)
        self._reconnect_base = reconnect_base
        self._reconnect_max = reconnect_max
        self._max_reconnects = max_reconnects
        self._dedup_window = dedup_window
        self._parse = parse
        self._rng = rng or random.Random()
        self._previews = PreviewAccumulator()
        self._overlap: OrderedDict[str, None] = OrderedDict()
        self.reconnects = 0
        self.finished = False

    @property
    def cursor(self) -> str | None:
        return self._cursor

    def __aiter__(self) -> AsyncIterator[E | Preview]:
        # Which events may come unparsed is fixed by `parse`; `SessionClient.subscribe`'s overloads
        # give the matching `E`.
        return cast("AsyncIterator[E | Preview]", self._run())

    async def _run(self) -> AsyncIterator[SubscriptionItem]:
        failures = 0
        while not self.finished:
            try:
                async with self._client.stream(self.session_id, deltas=self._delta_types, parse=self._parse) as stream:
                    self._overlap.clear()
                    async for event in self._client.list(self.session_id, after=self._cursor):
                        if event.id is not None and event.id in self._overlap:
                            continue
                        self._remember(event.id)
                        for item in self._accept(event):
                            yield item
                        if self.finished:
                            return
                    failures = 0  # connected and caught up
                    async for live in stream:
                        for item in self.accept_live(live):
                            yield item
                        if self.finished:
                            return
                log.debug("stream of %s ended without a terminal event; resuming", self.session_id)
            except _RECONNECTABLE as exc:
                log.info("stream of %s dropped (%r); resuming after %s", self.session_id, exc, self._cursor)
            failures += 1
            self.reconnects += 1
            if self._max_reconnects is not None and self.reconnects > self._max_reconnects:
                raise TransportError(f"{self.session_id}: gave up after {self.reconnects} drops")
            ceiling = min(self._reconnect_max, self._reconnect_base * (2 ** (failures - 1)))
            await asyncio.sleep(self._rng.uniform(0, ceiling) if failures > 1 else 0)

    def _remember(self, event_id: str | None) -> None:
        if event_id is None:
            return
        self._overlap[event_id] = None
        if len(self._overlap) > self._dedup_window:
            self._overlap.popitem(last=False)

    def accept_live(self, event: ServerEvent | UnparsedEvent) -> list[SubscriptionItem]:
        """What a live event delivers: nothing for a preview of history already delivered."""
        if event.type in PREVIEW_TYPES:
            target = event.event.id if isinstance(event, EventStart) else getattr(event, "event_id", None)
            if target is not None and target in self._overlap:
                return []  # preview of an event history already delivered
            return self._accept(event)
        if self._overlap:
            if event.id in self._overlap:
                return []  # delivered by the history read
            self._overlap.clear()  # first event past the history head: overlap is over
        return self._accept(event)

    def _accept(self, event: ServerEvent | UnparsedEvent) -> list[SubscriptionItem]:
        if isinstance(event, EventStart | EventDelta):
            if not self._delta_types:
                return []
            return [self._previews.apply(event)]
        if event.type == "span.model_request_end":
            self._previews.clear()  # a request that ended without its final event closes its previews
        elif self._previews:
            self._previews.finish(event.id)
        if event.id is not None:
            self._cursor = event.id
        if event.type in TERMINAL_TYPES:
            self.finished = True
        return [event]
