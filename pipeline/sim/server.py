"""``switchboard sim``: the reference session server (aiohttp), both profiles.

Data plane (``{p}`` = ``/api/v3`` for ark, ``/v1`` for anthropic; auth per profile):
  GET    {p}/sessions/{id}                     session object
  POST   {p}/sessions/{id}/events              send; ark: one event per request except user+system
  GET    {p}/sessions/{id}/events              history: limit, order, after, page -> {data, next_page}
  GET    {p}/sessions/{id}/events/stream       SSE; event_deltas=… (repeat) or event_deltas[]=…
  POST   /v1/sessions, DELETE /v1/sessions/{id} anthropic data-plane create/delete
Control plane: ``POST /?Action=CreateSession|DeleteSession&Version=…`` (Volcengine V4 signature).
Correction: ``POST /chat/completions``, ``/api/v3/chat/completions``, ``/v1/chat/completions``.
Admin (no auth): ``POST /_sim/sessions``, ``POST /_sim/faults``, ``GET /_sim/faults``,
``GET /_sim/stats``, ``POST /_sim/drop_streams`` (body ``{"session_id": …}`` optional).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from pipeline.session import volc_sign
from pipeline.session.models import parse_client_event
from pipeline.sim.correction import handle_chat_completions
from pipeline.sim.session import CLOSE, DROP, PING, SimContext, SimSession, Subscriber, new_id
from pipeline.sim.settings import SimSettings

PROFILE_PREFIXES = {"ark": "/api/v3", "anthropic": "/v1"}
MAX_PAGE = 1000

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, error_type: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(
        {"type": "error", "error": {"type": error_type, "message": message}}, status=status, headers=headers
    )


class SimApp:
    """Holds the sessions and serves them; ``SimServer`` wraps it in a runner."""

    def __init__(self, settings: SimSettings) -> None:
        self.settings = settings
        self.context = SimContext(settings=settings, rng=random.Random(settings.seed))
        self.sessions: dict[str, SimSession] = {}
        self.open_streams = 0
        self.app = web.Application(client_max_size=8 * 1024 * 1024)
        self._routes()

    # ------------------------------------------------------------------ wiring

    def _routes(self) -> None:
        router = self.app.router
        for profile, prefix in PROFILE_PREFIXES.items():
            router.add_get(f"{prefix}/sessions/{{sid}}", partial(self.get_session, profile))
            router.add_post(f"{prefix}/sessions/{{sid}}/events", partial(self.post_events, profile))
            router.add_get(f"{prefix}/sessions/{{sid}}/events", partial(self.list_events, profile))
            router.add_get(f"{prefix}/sessions/{{sid}}/events/stream", partial(self.stream_events, profile))
            router.add_post(f"{prefix}/chat/completions", self.chat_completions)
        router.add_post("/v1/sessions", self.create_session_anthropic)
        router.add_delete("/v1/sessions/{sid}", self.delete_session_anthropic)
        router.add_post("/chat/completions", self.chat_completions)
        router.add_post("/", self.openapi)
        router.add_post("/_sim/sessions", self.admin_create_session)
        router.add_post("/_sim/faults", self.admin_set_faults)
        router.add_get("/_sim/faults", self.admin_get_faults)
        router.add_get("/_sim/stats", self.admin_stats)
        router.add_post("/_sim/drop_streams", self.admin_drop_streams)

    def _authorized(self, request: web.Request, profile: str) -> bool:
        key = self.settings.api_key
        bearer_ok = request.headers.get("Authorization") == f"Bearer {key}"
        if profile == "anthropic":
            # x-api-key per the spec; the official SDK 2.x sends the api key as a Bearer token.
            return request.headers.get("x-api-key") == key or bearer_ok
        return bearer_ok

    async def _enter(self, request: web.Request, profile: str) -> SimSession | web.Response:
        """Common prologue: injected latency, auth, session lookup."""
        faults = self.settings.faults
        if faults.latency_ms > 0:
            await asyncio.sleep(faults.latency_ms / 1000)
        if not self._authorized(request, profile):
            return _error(401, "authentication_error", "invalid api key")
        session = self.sessions.get(request.match_info["sid"])
        if session is None or session.gone:
            return _error(404, "not_found_error", "session not found")
        return session

    def create_session(self, *, agent: Any = None, environment_id: str = "") -> SimSession:
        session = SimSession(new_id("sesn-"), self.context, agent=agent, environment_id=environment_id)
        self.sessions[session.id] = session
        self.context.stats["sessions_created"] += 1
        return session

    def delete_session(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        if session is None or session.gone:
            return False
        session.delete()
        return True

    def stop(self) -> None:
        for session in self.sessions.values():
            session.stop()

    # ------------------------------------------------------------------ sessions

    @staticmethod
    def session_object(session: SimSession) -> dict[str, Any]:
        return {
            "id": session.id,
            "type": "session",
            "status": session.status,
            "agent": session.agent
            if isinstance(session.agent, dict)
            else {"type": "agent", "id": session.agent or "agent-sim", "name": session.agent_name},
            "environment_id": session.environment_id or "env-sim",
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "archived_at": None,
            "title": None,
            "metadata": {},
            "resources": [],
            "outcome_evaluations": [],
            "vault_ids": [],
            "stats": {"active_seconds": round(session.usage.active_seconds, 3)},
            "usage": session.usage.snapshot(),
        }

    async def get_session(self, profile: str, request: web.Request) -> web.Response:
        session = await self._enter(request, profile)
        if isinstance(session, web.Response):
            return session
        return web.json_response(self.session_object(session))

    async def create_session_anthropic(self, request: web.Request) -> web.Response:
        if not self._authorized(request, "anthropic"):
            return _error(401, "authentication_error", "invalid api key")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "body is not JSON")
        if not isinstance(body, dict) or "agent" not in body:
            return _error(400, "invalid_request_error", "agent is required")
        session = self.create_session(agent=body.get("agent"), environment_id=str(body.get("environment_id") or ""))
        return web.json_response(self.session_object(session))

    async def delete_session_anthropic(self, request: web.Request) -> web.Response:
        if not self._authorized(request, "anthropic"):
            return _error(401, "authentication_error", "invalid api key")
        session_id = request.match_info["sid"]
        if not self.delete_session(session_id):
            return _error(404, "not_found_error", "session not found")
        return web.json_response({"id": session_id, "type": "session_deleted"})

    # ------------------------------------------------------------------ events

    async def post_events(self, profile: str, request: web.Request) -> web.Response:
        session = await self._enter(request, profile)
        if isinstance(session, web.Response):
            return session
        faults = self.settings.faults
        stats = self.context.stats
        stats["post_events"] += 1
        rng = self.context.rng
        if faults.rate_429 and rng.random() < faults.rate_429:
            stats["injected_429"] += 1
            return _error(429, "rate_limit_error", "simulated rate limit", {"retry-after": f"{faults.retry_after:g}"})
        if faults.rate_500 and rng.random() < faults.rate_500:
            stats["injected_500"] += 1
            return _error(500, "api_error", "simulated server error")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "invalid_request_error", "body is not JSON")
        raw_events = body.get("events") if isinstance(body, dict) else None
        if not isinstance(raw_events, list) or not raw_events:
            return _error(400, "invalid_request_error", "events must be a non-empty array")
        problem = self._check_batch(session, profile, raw_events)
        if problem is not None:
            stats["rejected_batches"] += 1
            return _error(409 if problem.startswith("duplicate") else 400, "invalid_request_error", problem)
        echoed = [self._accept(session, profile, event) for event in raw_events]
        if faults.accept_delay > 0:
            await asyncio.sleep(faults.accept_delay)  # accepted already: the client may time out meanwhile
        return web.json_response({"data": echoed})

    def _check_batch(self, session: SimSession, profile: str, raw_events: list[Any]) -> str | None:
        """Whole-batch validation before anything is accepted (a batch is atomic)."""
        if session.status == "terminated":
            return "session is terminated: no more events may be sent"
        types: list[str] = []
        for raw in raw_events:
            if not isinstance(raw, dict):
                return "every event must be an object"
            if "processed_at" in raw:
                return "processed_at is generated by the server (P1)"
            try:
                parse_client_event(raw)
            except ValidationError as exc:
                return f"invalid {raw.get('type')!r} event: {exc.errors()[0]['msg']}"
            types.append(raw["type"])
        for position, kind in enumerate(types):
            if kind == "system.message" and (position == 0 or types[position - 1] != "user.message"):
                return "system.message must directly follow a user.message in the same request (P5)"
        if profile == "ark" and len(types) > 1 and types != ["user.message", "system.message"]:
            return "ark accepts one event per request, except a user.message with its system.message"
        open_ids = session.open_action_ids()
        for raw in raw_events:
            kind = raw["type"]
            if kind == "user.message" and raw.get("id") and raw["id"] in session.index:
                return f"duplicate event id {raw['id']}"
            answered = raw.get("custom_tool_use_id") if kind == "user.custom_tool_result" else raw.get("tool_use_id")
            if kind in ("user.tool_confirmation", "user.tool_result", "user.custom_tool_result"):
                if answered not in open_ids:
                    return f"{answered} is not awaiting an answer"
                open_ids.discard(answered)
        return None

    def _accept(self, session: SimSession, profile: str, raw: dict[str, Any]) -> dict[str, Any]:
        kind = raw["type"]
        fields = {k: v for k, v in raw.items() if k not in ("type", "id", "processed_at")}
        client_id = raw.get("id") if kind == "user.message" else None  # P3: echo the client's id
        echoed = session.emit(kind, fields, event_id=client_id)
        self.context.stats[f"accepted:{kind}"] += 1
        if kind == "user.message":
            session.enqueue_message(echoed)
        elif kind == "user.tool_confirmation" or kind == "user.tool_result":
            session.answer(raw["tool_use_id"], raw)
        elif kind == "user.custom_tool_result":
            session.answer(raw["custom_tool_use_id"], raw)
        elif kind == "user.interrupt" and not session.interrupt() and profile == "ark":
            session.emit(
                "session.error",
                {
                    "error": {
                        "type": "unknown_error",
                        "message": "no active turn to cancel",
                        "retry_status": {"type": "exhausted"},
                    }
                },
            )
        return echoed

    async def list_events(self, profile: str, request: web.Request) -> web.Response:
        session = await self._enter(request, profile)
        if isinstance(session, web.Response):
            return session
        query = request.query
        try:
            limit = min(max(int(query.get("limit", "100")), 1), MAX_PAGE)
        except ValueError:
            return _error(400, "invalid_request_error", "limit must be an integer")
        order = query.get("order", "asc")
        if order not in ("asc", "desc"):
            return _error(400, "invalid_request_error", "order must be asc or desc")
        low = 0
        after = query.get("after")
        if after:
            position = session.index.get(after)
            if position is None:
                return _error(400, "invalid_request_error", f"unknown event id {after}")
            low = position + 1
        log = session.log
        page = query.get("page")
        # Page tokens hold absolute log positions, so pages stay stable while the log grows.
        if page:
            try:
                _, cursor_text, low_text = page.split("_")
                cursor, low = int(cursor_text), int(low_text)
            except ValueError:
                return _error(400, "invalid_request_error", "bad page token")
        else:
            cursor = low if order == "asc" else len(log)
        if order == "asc":
            end = min(cursor + limit, len(log))
            data = log[cursor:end]
            next_page = f"pg_{end}_{low}" if end < len(log) else None
        else:
            start = max(cursor - limit, low)
            data = log[start:cursor][::-1]
            next_page = f"pg_{start}_{low}" if start > low else None
        self.context.stats["history_pages"] += 1
        return web.json_response({"data": data, "next_page": next_page})

    async def stream_events(self, profile: str, request: web.Request) -> web.StreamResponse:
        session = await self._enter(request, profile)
        if isinstance(session, web.Response):
            return session
        deltas = frozenset(request.query.getall("event_deltas", []) + request.query.getall("event_deltas[]", []))
        subscriber = Subscriber(deltas)
        # Registered before the headers go out: once the client sees the response, nothing is missed.
        session.subscribers.add(subscriber)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        self.open_streams += 1
        self.context.stats["streams_opened"] += 1
        try:
            await response.prepare(request)
            await self._pump(subscriber, response, request)
        except ConnectionError:
            pass  # the client went away: nothing to clean up beyond the finally below
        finally:
            self.open_streams -= 1
            session.subscribers.discard(subscriber)
        return response

    async def _pump(self, subscriber: Subscriber, response: web.StreamResponse, request: web.Request) -> None:
        queue = subscriber.queue
        ping_interval = self.settings.ping_interval
        while True:
            try:
                async with asyncio.timeout(ping_interval):
                    frame = await queue.get()
            except TimeoutError:
                await response.write(PING)
                continue
            frames = [frame]
            while not queue.empty() and frames[-1] not in (CLOSE, DROP):
                frames.append(queue.get_nowait())
            last = frames[-1]
            payload = b"".join(f for f in frames if f not in (CLOSE, DROP))
            if payload:
                await response.write(payload)
            if last is DROP:
                if request.transport is not None:
                    request.transport.abort()  # abrupt: the client sees a broken chunked body
                return
            if last is CLOSE:
                await response.write_eof()
                return

    # ------------------------------------------------------------------ control plane & extras

    async def openapi(self, request: web.Request) -> web.Response:
        body = await request.read()
        signer = volc_sign.verify(
            credentials=self.settings.openapi_credentials,
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=body,
        )
        action = request.query.get("Action", "")
        metadata: dict[str, Any] = {
            "RequestId": new_id("req-"),
            "Action": action,
            "Version": request.query.get("Version", ""),
        }
        if signer is None:
            metadata["Error"] = {"Code": "SignatureDoesNotMatch", "Message": "signature verification failed"}
            return web.json_response({"ResponseMetadata": metadata}, status=401)
        try:
            payload = await request.json() if body else {}
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            metadata["Error"] = {"Code": "InvalidParameter", "Message": "body must be a JSON object"}
            return web.json_response({"ResponseMetadata": metadata}, status=400)
        if action == "CreateSession":
            session = self.create_session(agent=payload.get("AgentId"))
            return web.json_response({"ResponseMetadata": metadata, "Result": {"Id": session.id}})
        if action == "DeleteSession":
            session_id = str(payload.get("Id") or payload.get("SessionId") or "")
            if not self.delete_session(session_id):
                metadata["Error"] = {"Code": "NotFound", "Message": "session not found"}
                return web.json_response({"ResponseMetadata": metadata}, status=404)
            return web.json_response({"ResponseMetadata": metadata, "Result": {}})
        metadata["Error"] = {"Code": "InvalidAction", "Message": f"unsupported action {action!r}"}
        return web.json_response({"ResponseMetadata": metadata}, status=400)

    async def chat_completions(self, request: web.Request) -> web.Response:
        return await handle_chat_completions(request, self.settings.api_key)

    async def admin_create_session(self, request: web.Request) -> web.Response:
        session = self.create_session()
        return web.json_response({"id": session.id})

    async def admin_set_faults(self, request: web.Request) -> web.Response:
        try:
            changes = await request.json()
            if not isinstance(changes, dict):
                raise ValueError("expected a JSON object")
            self.settings.faults.update(changes)
        except (ValueError, TypeError) as exc:
            return _error(400, "invalid_request_error", str(exc))
        if "seed" in changes and changes["seed"] is not None:
            self.context.rng.seed(int(changes["seed"]))
        return web.json_response(self.settings.faults.as_dict())

    async def admin_get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.settings.faults.as_dict())

    async def admin_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                **self.context.stats,
                "sessions": sum(1 for s in self.sessions.values() if not s.gone),
                "open_streams": self.open_streams,
                "faults": self.settings.faults.as_dict(),
            }
        )

    async def admin_drop_streams(self, request: web.Request) -> web.Response:
        body: Any = await request.json() if request.can_read_body else {}
        session_id = body.get("session_id") if isinstance(body, dict) else None
        targets = [self.sessions[session_id]] if session_id in self.sessions else list(self.sessions.values())
        if session_id and session_id not in self.sessions:
            return _error(404, "not_found_error", "session not found")
        dropped = sum(session.drop_all_streams() for session in targets)
        return web.json_response({"dropped": dropped})


class SimServer:
    """In-process simulator: ``port = await SimServer().start()``; ``await stop()``."""

    def __init__(self, settings: SimSettings | None = None, **overrides: Any) -> None:
        self.settings = settings or SimSettings()
        for name, value in overrides.items():
            setattr(self.settings, name, value)
        self.sim = SimApp(self.settings)
        self.host = "127.0.0.1"
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def sessions(self) -> dict[str, SimSession]:
        return self.sim.sessions

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._runner = web.AppRunner(
            self.sim.app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            handler_cancellation=True,  # a client that goes away ends its stream handler at once
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, backlog=4096)
        await site.start()
        self.host = host
        self.port = int(self._runner.addresses[0][1])
        return self.port

    async def stop(self) -> None:
        self.sim.stop()  # ends every open stream so the runner does not wait on them
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def root_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def base_url(self, profile: str = "ark") -> str:
        return self.root_url + PROFILE_PREFIXES[profile]

    async def create_session(self) -> str:
        return self.sim.create_session().id

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
