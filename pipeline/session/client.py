"""Async HTTP client of the session data plane (send, history, stream, session get/create/delete).

Retries follow :class:`RetryPolicy`. Sends are made safe to retry: a send whose outcome is unknown
(timeout, dropped connection, 5xx) is looked up in history by its delivery key (the client-supplied
``user.message`` id, P3, or the tool-use id a confirmation/result answers) before it is ever re-sent.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, overload

import httpx
from httpx_sse import EventSource
from pydantic import BaseModel
from pydantic_core import from_json

from pipeline.session.exceptions import (
    AuthError,
    BadRequestError,
    NotFoundError,
    ProtocolError,
    RateLimitedError,
    SendTimeoutError,
    ServerError,
    SessionAPIError,
    TransportError,
)
from pipeline.session.models import (
    SERVER_EVENT_TYPES,
    TERMINAL_TYPES,
    ClientEvent,
    ServerEvent,
    UnparsedEvent,
    UserMessage,
    parse_server_event_json,
    parse_server_events,
    serialize_client_event,
)
from pipeline.session.profiles import Profile, get_profile
from pipeline.session.retry import RETRYABLE_STATUSES, RetryPolicy, parse_retry_after
from pipeline.session.transport import session_transport

if TYPE_CHECKING:
    from pipeline.session.subscription import Subscription

log = logging.getLogger(__name__)

Order = Literal["asc", "desc"]

# Raised before the request reached the server: always safe to retry.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
# The server may have acted on the request: a send must be looked up before it is repeated.
_OUTCOME_UNKNOWN = (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


def error_for_status(status: int, body: object, retry_after: float | None = None) -> SessionAPIError:
    message = f"session API answered {status}: {body}"
    if status in (401, 403):
        return AuthError(message, status=status, body=body)
    if status == 404:
        return NotFoundError(message, status=status, body=body)
    if status == 429:
        return RateLimitedError(message, status=status, body=body, retry_after=retry_after)
    if status >= 500:
        return ServerError(message, status=status, body=body)
    return BadRequestError(message, status=status, body=body)


def _decode_body(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return response.text


def delivery_key(event: Mapping[str, Any]) -> tuple[str, str] | None:
    """What identifies an already-delivered client event in history, if anything does."""
    kind = event.get("type")
    if kind == "user.message" and event.get("id"):
        return ("id", str(event["id"]))
    if kind in ("user.tool_confirmation", "user.tool_result") and event.get("tool_use_id"):
        return (str(kind), str(event["tool_use_id"]))
    if kind == "user.custom_tool_result" and event.get("custom_tool_use_id"):
        return (str(kind), str(event["custom_tool_use_id"]))
    return None


def _key_of_server_event(event: ServerEvent) -> tuple[str, str] | None:
    kind = event.type
    if kind == "user.message" and event.id:
        return ("id", event.id)
    tool_use_id = getattr(event, "tool_use_id", None)
    if kind in ("user.tool_confirmation", "user.tool_result") and tool_use_id:
        return (kind, tool_use_id)
    custom_id = getattr(event, "custom_tool_use_id", None)
    if kind == "user.custom_tool_result" and custom_id:
        return (kind, custom_id)
    return None


class EventStream:
    """One SSE connection. ``async with client.stream(sid) as events: async for e in events``.

    Entering returns once the server answered with headers, i.e. once the stream is open: events after
    that point will be delivered (there is no replay). Pings are skipped; ``event: error`` raises.
    """

    def __init__(self, http: httpx.AsyncClient, request: httpx.Request, *, parse: frozenset[str] | None = None) -> None:
        self._http = http
        self._request = request
        self._response: httpx.Response | None = None
        # Known types outside `parse` come as `UnparsedEvent`s (type and id only); None: parse all.
        self._skip = SERVER_EVENT_TYPES - parse - TERMINAL_TYPES if parse is not None else frozenset()

    async def __aenter__(self) -> EventStream:
        response = await self._http.send(self._request, stream=True)
        if response.status_code >= 400:
            await response.aread()
            body = _decode_body(response)
            await response.aclose()
            raise error_for_status(response.status_code, body, parse_retry_after(response.headers.get("retry-after")))
        self._response = response
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._response is not None:
            await self._response.aclose()
            self._response = None

    async def __aiter__(self) -> AsyncIterator[ServerEvent | UnparsedEvent]:
        if self._response is None:
            raise RuntimeError("EventStream used outside 'async with'")
        skip = self._skip
        async for sse in EventSource(self._response).aiter_sse():
            if sse.event == "ping" or not sse.data:
                continue
            if sse.event == "error":
                raise ProtocolError(f"stream error: {sse.data}", body=sse.data)
            if sse.event in skip:  # the SSE event name is the event's type (a server that names
                yield _unparsed(sse.event, sse.data)  # no type gets "message": parsed in full)
            else:
                yield parse_server_event_json(sse.data)


def _unparsed(event_type: str, data: str) -> UnparsedEvent | ServerEvent:
    try:
        body = from_json(data)  # pydantic's parser: a few times cheaper than `json` for this
    except ValueError:
        return parse_server_event_json(data)  # an UnknownEvent with the error
    event_id = body.get("id") if isinstance(body, dict) else None
    return UnparsedEvent(type=event_type, id=event_id if isinstance(event_id, str) else None)


class SessionClient:
    """Data-plane client for one profile (``ark`` default, or ``anthropic``)."""

    def __init__(
        self,
        *,
        api_key: str,
        profile: str | Profile = "ark",
        base_url: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        stream_read_timeout: float = 90.0,
        max_connections: int = 16,
        max_keepalive_connections: int = 16,
        max_stream_connections: int = 10_000,
        streams_per_pool: int = 256,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        assign_message_ids: bool = True,
        history_lookup_limit: int = 500,
    ) -> None:
        self.profile = get_profile(profile)
        self.base_url = (base_url or self.profile.default_base_url).rstrip("/")
        self.retry = retry or RetryPolicy()
        self.assign_message_ids = assign_message_ids
        self.history_lookup_limit = history_lookup_limit
        self._headers = {"Accept": "application/json", **self.profile.auth_headers(api_key)}
        self._urls: dict[str, httpx.URL] = {}
        self._transport = transport
        # One TLS context for every pool: building one costs tens of milliseconds.
        self._ssl_context = httpx.create_ssl_context()
        # httpcore's pool does O(connections) work per request, so the request pool stays small
        # (a few keep-alive connections serve thousands of sends per second) ...
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_keepalive_connections),
            transport=transport or session_transport(max_connections, self._ssl_context),
            verify=self._ssl_context,
        )
        # Callers beyond the pool size wait here, not in httpcore's queue (costly to scan when long).
        self._request_slots = asyncio.Semaphore(max_connections)
        # ... and long-lived streams are spread over shards of ``streams_per_pool`` connections, kept
        # apart from the request pool so 10k open streams never starve sends.
        self._stream_timeout = httpx.Timeout(connect_timeout, read=stream_read_timeout)
        self._streams_per_pool = max(streams_per_pool, 1)
        shard_count = -(-max_stream_connections // self._streams_per_pool)
        self._stream_pools: list[httpx.AsyncClient | None] = [None] * max(shard_count, 1)

    def _stream_pool(self, session_id: str) -> httpx.AsyncClient:
        index = hash(session_id) % len(self._stream_pools)
        pool = self._stream_pools[index]
        if pool is None:
            pool = httpx.AsyncClient(
                base_url=self.base_url,
                headers=self._headers,
                timeout=self._stream_timeout,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
                transport=self._transport or session_transport(None, self._ssl_context),
                verify=self._ssl_context,
            )
            self._stream_pools[index] = pool
        return pool

    async def __aenter__(self) -> SessionClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()
        for pool in self._stream_pools:
            if pool is not None:
                await pool.aclose()

    # ------------------------------------------------------------------ plain requests

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        params: httpx.QueryParams | Mapping[str, str | int] | None = None,
        idempotent: bool = True,
    ) -> object:
        """One API call with retries on 429/5xx/connect errors. Non-idempotent calls are retried only
        when the request cannot have reached the server (connect failure, 429)."""
        attempt = 0
        while True:
            retry_after: float | None = None
            try:
                async with self._request_slots:
                    response = await self._http.request(method, path, json=json, params=params)
            except _NOT_SENT as exc:
                error: SessionAPIError = TransportError(f"{method} {path}: {exc!r}")
            except _OUTCOME_UNKNOWN as exc:
                if not idempotent:
                    raise TransportError(f"{method} {path}: outcome unknown: {exc!r}") from exc
                error = TransportError(f"{method} {path}: {exc!r}")
            else:
                if response.status_code < 400:
                    return _decode_body(response) if response.content else None
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                error = error_for_status(response.status_code, _decode_body(response), retry_after)
                retryable = response.status_code in RETRYABLE_STATUSES and (idempotent or response.status_code == 429)
                if not retryable:
                    raise error
            attempt += 1
            if attempt >= self.retry.max_attempts:
                raise error
            await asyncio.sleep(self.retry.delay(attempt - 1, retry_after))

    # ------------------------------------------------------------------ sessions

    async def get_session(self, session_id: str) -> dict[str, Any]:
        body = await self.request("GET", f"/sessions/{session_id}")
        if not isinstance(body, dict):
            raise ProtocolError("session body is not an object", body=body)
        return body

    async def create_session(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Data-plane create (anthropic profile). Not retried on ambiguous failures (not idempotent)."""
        result = await self.request("POST", "/sessions", json=dict(body), idempotent=False)
        if not isinstance(result, dict) or not isinstance(result.get("id"), str):
            raise ProtocolError("create session answer has no id", body=result)
        return result

    async def delete_session(self, session_id: str) -> None:
        try:
            await self.request("DELETE", f"/sessions/{session_id}")
        except NotFoundError:
            pass  # already gone: deleting is idempotent from the caller's point of view

    # ------------------------------------------------------------------ events

    async def send(
        self, session_id: str, events: Sequence[ClientEvent | BaseModel | Mapping[str, Any]], *, echo: bool = True
    ) -> list[ServerEvent]:
        """Send client events, split into the requests the profile allows (Ark: one event per request,
        except a user.message with its system.message, P5). Returns the server's echo of each event
        (``[]`` when the server answers without a body, or with ``echo=False``: not parsed)."""
        wire = [self._to_wire(e) for e in events]
        echoed: list[ServerEvent] = []
        for batch in self.profile.split_batch(wire):
            echoed.extend(await self._send_batch(session_id, batch, echo=echo))
        return echoed

    def _to_wire(self, event: ClientEvent | BaseModel | Mapping[str, Any]) -> dict[str, Any]:
        body = serialize_client_event(event) if isinstance(event, BaseModel) else dict(event)
        if self.assign_message_ids and body.get("type") == "user.message" and not body.get("id"):
            # A stable client id (P3) is what makes a timed-out send safe to look up and retry.
            body["id"] = f"sevt-cli-{uuid.uuid4().hex}"
        return body

    async def _send_batch(self, session_id: str, batch: list[dict[str, Any]], *, echo: bool) -> list[ServerEvent]:
        path = f"/sessions/{session_id}/events"
        url = self._events_url(session_id)
        keys = [k for k in (delivery_key(e) for e in batch) if k is not None]
        maybe_delivered = False
        attempt = 0
        while True:
            retry_after: float | None = None
            error: SessionAPIError
            try:
                if maybe_delivered:
                    found = await self._find_delivered(session_id, keys, len(batch))
                    if found is not None:
                        log.info("send to %s confirmed in history after an unknown outcome", session_id)
                        return found
                    maybe_delivered = False
                async with self._request_slots:
                    response = await self._http.post(url, json={"events": batch})
            except _NOT_SENT as exc:
                error = TransportError(f"POST {path}: {exc!r}")
            except _OUTCOME_UNKNOWN as exc:
                if not keys:
                    raise SendTimeoutError(f"POST {path}: outcome unknown, no key to look up: {exc}") from exc
                maybe_delivered = True
                error = SendTimeoutError(f"POST {path}: outcome unknown: {exc!r}")
            except SessionAPIError as exc:  # the history lookup itself failed after its retries
                error = exc
            else:
                if response.status_code < 400:
                    return self._echo_of(response) if echo else []
                retry_after = parse_retry_after(response.headers.get("retry-after"))
                error = error_for_status(response.status_code, _decode_body(response), retry_after)
                if response.status_code == 409 and keys:
                    # Conflict on our own stable id: an earlier attempt got through after all.
                    found = await self._find_delivered(session_id, keys, len(batch))
                    if found is not None:
                        return found
                if response.status_code not in RETRYABLE_STATUSES:
                    raise error
                # A 5xx may come after the server acted: look it up before re-sending (429 never acted).
                maybe_delivered = response.status_code >= 500 and bool(keys)
            attempt += 1
            if attempt >= self.retry.max_attempts:
                raise error
            await asyncio.sleep(self.retry.delay(attempt - 1, retry_after))

    def _events_url(self, session_id: str) -> httpx.URL:
        """The session's events URL, parsed once (httpx's URL parsing costs more than the rest of
        building a request); a bounded memory of the sessions in use."""
        url = self._urls.get(session_id)
        if url is None:
            if len(self._urls) >= 16_384:
                self._urls.clear()
            url = self._urls[session_id] = httpx.URL(f"{self.base_url}/sessions/{session_id}/events")
        return url

    @staticmethod
    def _echo_of(response: httpx.Response) -> list[ServerEvent]:
        if not response.content:
            return []
        body = _decode_body(response)
        data = body.get("data") if isinstance(body, dict) else None
        return parse_server_events(data) if isinstance(data, list) else []

    async def _find_delivered(
        self, session_id: str, keys: list[tuple[str, str]], batch_size: int
    ) -> list[ServerEvent] | None:
        """Search recent history (newest first) for the batch's first delivery key; the server accepts a
        batch atomically, so one key found means the whole batch was delivered."""
        wanted = keys[0]
        newer: list[ServerEvent] = []  # events after the match, newest first
        scanned = 0
        async for event in self.list(session_id, order="desc", limit=100):
            if _key_of_server_event(event) == wanted:
                following = list(reversed(newer))[: batch_size - 1]
                return [event, *following]
            newer.append(event)
            if len(newer) > batch_size:
                newer.pop(0)
            scanned += 1
            if scanned >= self.history_lookup_limit:
                break
        return None

    async def list(
        self,
        session_id: str,
        *,
        after: str | None = None,
        limit: int = 100,
        order: Order = "asc",
    ) -> AsyncIterator[ServerEvent]:
        """Every history event (all pages), optionally only those after the event id ``after``.
        Profiles without a native ``after`` (anthropic) page from the start and skip up to it."""
        params: dict[str, str | int] = {"limit": limit, "order": order}
        native_after = after is not None and self.profile.native_after
        if native_after and after is not None:
            params["after"] = after
        skipping = after is not None and not native_after
        while True:
            body = await self.request("GET", f"/sessions/{session_id}/events", params=params)
            if not isinstance(body, dict):
                raise ProtocolError("history page is not an object", body=body)
            data = body.get("data") or []
            if not isinstance(data, list):
                raise ProtocolError("history page data is not a list", body=body)
            for event in parse_server_events(data):
                if skipping:
                    skipping = event.id != after
                    continue
                yield event
            next_page = body.get("next_page")
            if not next_page:
                return
            params["page"] = str(next_page)

    def stream(
        self, session_id: str, *, deltas: Sequence[str] = (), parse: frozenset[str] | None = None
    ) -> EventStream:
        """Raw SSE stream of the session (no resume: see :func:`subscribe` for that). ``deltas`` lists the
        event types to preview (``agent.message``, ``agent.thinking``); with ``parse``, events of other
        known types come as `UnparsedEvent` (type and id) instead of being parsed."""
        pool = self._stream_pool(session_id)
        request = pool.build_request(
            "GET",
            f"/sessions/{session_id}/events/stream",
            params=self.profile.delta_params(deltas),
            headers={"Accept": "text/event-stream"},
        )
        return EventStream(pool, request, parse=parse)

    @overload
    def subscribe(
        self,
        session_id: str,
        *,
        after: str | None = None,
        deltas: bool | Sequence[str] = False,
        reconnect_base: float = 0.1,
        reconnect_max: float = 5.0,
        max_reconnects: int | None = None,
        dedup_window: int = 512,
        parse: None = None,
    ) -> Subscription[ServerEvent]: ...

    @overload
    def subscribe(
        self,
        session_id: str,
        *,
        after: str | None = None,
        deltas: bool | Sequence[str] = False,
        reconnect_base: float = 0.1,
        reconnect_max: float = 5.0,
        max_reconnects: int | None = None,
        dedup_window: int = 512,
        parse: frozenset[str],
    ) -> Subscription[ServerEvent | UnparsedEvent]: ...

    def subscribe(
        self,
        session_id: str,
        *,
        after: str | None = None,
        deltas: bool | Sequence[str] = False,
        reconnect_base: float = 0.1,
        reconnect_max: float = 5.0,
        max_reconnects: int | None = None,
        dedup_window: int = 512,
        parse: frozenset[str] | None = None,
    ) -> Subscription[ServerEvent] | Subscription[ServerEvent | UnparsedEvent]:
        """Resumable subscription (see :class:`pipeline.session.subscription.Subscription`). With
        ``parse``, live events of other known types come as `UnparsedEvent` (type and id)."""
        from pipeline.session.subscription import Subscription  # circular at import time

        return Subscription[ServerEvent | UnparsedEvent](
            self,
            session_id,
            after=after,
            deltas=deltas,
            reconnect_base=reconnect_base,
            reconnect_max=reconnect_max,
            max_reconnects=max_reconnects,
            dedup_window=dedup_window,
            parse=parse,
        )

    @staticmethod
    def new_message(text: str, *, message_id: str | None = None) -> UserMessage:
        """Convenience: a text user.message with a stable id (P3)."""
        from pipeline.session.models import TextBlock

        return UserMessage(id=message_id or f"sevt-cli-{uuid.uuid4().hex}", content=[TextBlock(text=text)])
