"""A stand-in Telegram Bot API for polling: `getUpdates` (long polling), `getMe`, `deleteWebhook`,
and the send methods (checked by the Bot API stand-in's checker of tests/platforms/test_telegram.py).

It checks requests the way Telegram does: the token in the path (401 otherwise), `offset`,
`timeout`, `limit` and `allowed_updates` of the right types (400 otherwise), no `getUpdates` while a
webhook is set (409), and a second `getUpdates` while one is waiting ends the first with 409
Conflict (counted in `conflicts` when the first poller was still connected: two pollers at once).
Updates are PTB `Update`s (`to_dict()`); an update stays until a poll with a higher `offset`
confirms it, and is served again until then. A failed check is kept in `errors`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web
from telegram import Chat, Message, Update, User

from tests.platforms.conftest import Seen
from tests.platforms.test_telegram import BOT, TOKEN, check_telegram_request

UPDATE_TYPES = frozenset(
    {
        "message",
        "edited_message",
        "channel_post",
        "edited_channel_post",
        "business_connection",
        "business_message",
        "edited_business_message",
        "deleted_business_messages",
        "message_reaction",
        "message_reaction_count",
        "inline_query",
        "chosen_inline_result",
        "callback_query",
        "shipping_query",
        "pre_checkout_query",
        "purchased_paid_media",
        "poll",
        "poll_answer",
        "my_chat_member",
        "chat_member",
        "chat_join_request",
        "chat_boost",
        "removed_chat_boost",
    }
)
CONFLICT = "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"
WEBHOOK_ACTIVE = (
    "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first"
)
USER_BASE = 60_000


def _error(status: int, description: str, **extra: Any) -> web.Response:
    return web.json_response({"ok": False, "error_code": status, "description": description, **extra}, status=status)


def _ok(result: Any) -> web.Response:
    return web.json_response({"ok": True, "result": result})


class BotApi:
    def __init__(self, token: str = TOKEN, *, webhook_url: str = "") -> None:
        self.token = token
        self.webhook_url = webhook_url
        self.url = ""
        self.pending: list[dict[str, Any]] = []  # unconfirmed, by update_id
        self.added: dict[int, dict[str, Any]] = {}  # every update, by update_id
        self.served: Counter[int] = Counter()  # times each update_id was in a poll's answer
        self.polls: list[dict[str, Any]] = []  # the parameters of each getUpdates
        self.calls: list[str] = []  # every method called, in order
        self.deleted_webhook: list[dict[str, Any]] = []
        self.replies: list[dict[str, Any]] = []  # accepted sendMessage bodies
        # Called with each accepted sendMessage body before it is answered (a test's crash hook).
        self.on_reply: Callable[[dict[str, Any]], None] | None = None
        self.conflicts = 0
        self.errors: list[str] = []
        self.scripted: list[web.Response] = []  # answers for the next polls, before anything else
        self._ids = itertools.count(900_000)
        self._message_ids = itertools.count(500)
        self._changed = asyncio.Event()
        self._waiting: tuple[web.Request, asyncio.Future[web.Response]] | None = None
        self._runner: web.AppRunner | None = None

    # -- what a test does --------------------------------------------------------------------------
    def private_text(self, n: int, text: str) -> Update:
        """A private text message from user 60000+n (its own chat), with the next update_id."""
        user = User(id=USER_BASE + n, first_name=f"User{n}", is_bot=False)
        chat = Chat(id=USER_BASE + n, type=Chat.PRIVATE, first_name=f"User{n}")
        when = dt.datetime.now(dt.UTC).replace(microsecond=0)
        message = Message(n, when, chat, from_user=user, text=text)
        return Update(next(self._ids), message=message)

    def add(self, update: Update) -> dict[str, Any]:
        data = update.to_dict()
        self.added[data["update_id"]] = data
        self.pending.append(data)
        self._changed.set()
        return data

    def served_chats(self) -> set[int]:
        """The chats of the updates a poll returned."""
        return {self.added[u]["message"]["chat"]["id"] for u in list(self.served) if "message" in self.added[u]}

    # -- server ------------------------------------------------------------------------------------
    async def start(self, port: int = 0) -> BotApi:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)  # a stand-in's log would show the token
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._waiting is not None and not self._waiting[1].done():
            self._waiting[1].set_result(_ok([]))
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        prefix = f"/bot{self.token}/"
        if not request.path.startswith(prefix):
            self.errors.append(f"{request.method} {request.path.split('/')[-1]}: not this bot's token")
            return _error(401, "Unauthorized")
        method = request.path[len(prefix) :]
        self.calls.append(method)
        params = dict(request.query)
        body = await request.read()
        if body:
            if request.content_type != "application/json":
                self.errors.append(f"{method}: content type {request.content_type}")
                return _error(400, "Bad Request: unsupported content type")
            loaded = json.loads(body)
            if not isinstance(loaded, dict):
                return _error(400, "Bad Request: parameters are not an object")
            params.update(loaded)
        if method == "getMe":
            return _ok(BOT.to_dict())
        if method == "deleteWebhook":
            return self._delete_webhook(params)
        if method == "getUpdates":
            return await self._get_updates(request, params)
        if method == "sendChatAction":
            return _ok(True)
        if method.startswith("send"):
            return self._send(request, method, params, body)
        self.errors.append(f"{method}: not served by the stand-in")
        return _error(404, "Not Found")

    def _delete_webhook(self, params: dict[str, Any]) -> web.Response:
        self.deleted_webhook.append(params)
        if params.get("drop_pending_updates") is True:
            self.errors.append("deleteWebhook dropped the pending updates")
            self.pending.clear()
        self.webhook_url = ""
        return web.json_response({"ok": True, "result": True, "description": "Webhook was deleted"})

    def _send(self, request: web.Request, method: str, params: dict[str, Any], body: bytes) -> web.Response:
        seen = Seen(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers={k.lower(): v for k, v in request.headers.items()},
            body=body,
            json=params,
        )
        try:
            check_telegram_request(seen)
        except AssertionError as exc:
            self.errors.append(f"{method}: {exc!r}")
            return _error(400, "Bad Request: stand-in check failed")
        self.replies.append(params)
        if self.on_reply is not None:
            self.on_reply(params)
        return _ok({"message_id": next(self._message_ids), "chat": {"id": params["chat_id"]}})

    async def _get_updates(self, request: web.Request, params: dict[str, Any]) -> web.Response:
        problem = _poll_problem(params)
        if problem:
            self.errors.append(f"getUpdates: {problem}")
            return _error(400, f"Bad Request: {problem}")
        self.polls.append(params)
        if self.scripted:
            return self.scripted.pop(0)
        if self.webhook_url:
            return _error(409, WEBHOOK_ACTIVE)
        if self._waiting is not None and not self._waiting[1].done():
            earlier, answer = self._waiting
            transport = earlier.transport
            if transport is not None and not transport.is_closing():
                self.conflicts += 1
            answer.set_result(_error(409, CONFLICT))
        offset = int(params["offset"]) if "offset" in params else None
        if offset is not None:
            self.pending = [u for u in self.pending if u["update_id"] >= offset]  # confirmed
        timeout, limit = int(params.get("timeout", 0)), int(params.get("limit", 100))
        answer = asyncio.get_running_loop().create_future()
        self._waiting = (request, answer)
        deadline = asyncio.get_running_loop().time() + timeout
        while not answer.done():
            ready = self.pending[:limit]
            if ready or asyncio.get_running_loop().time() >= deadline:
                for update in ready:
                    self.served[update["update_id"]] += 1
                answer.set_result(_ok(ready))
                break
            self._changed.clear()
            changed: asyncio.Future[Any] = asyncio.ensure_future(self._changed.wait())
            await asyncio.wait({changed, answer}, timeout=deadline - asyncio.get_running_loop().time())
            changed.cancel()
        return answer.result()


def _poll_problem(params: dict[str, Any]) -> str:
    """What Telegram would refuse in getUpdates parameters (query strings are numbers as text)."""
    for name in ("offset", "timeout", "limit"):
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"{name} must be an integer"
        if name == "timeout" and value < 0:
            return "timeout must be non-negative"
        if name == "limit" and not 1 <= value <= 100:
            return "limit must be in 1..100"
    allowed = params.get("allowed_updates")
    if isinstance(allowed, str):
        allowed = json.loads(allowed)
    if allowed is not None and (
        not isinstance(allowed, list) or any(not isinstance(a, str) or a not in UPDATE_TYPES for a in allowed)
    ):
        return f"allowed_updates is not a list of update types: {allowed!r}"
    unknown = set(params) - {"offset", "timeout", "limit", "allowed_updates"}
    return f"unknown parameters {sorted(unknown)}" if unknown else ""
