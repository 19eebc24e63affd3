"""The platform API stand-ins of `tests/platforms` (OneBot HTTP API, Telegram Bot API, Lark Open API,
Slack Web API, WeCom API, QQ bot OpenAPI, DingTalk robot OpenAPI and Stream gateway), served from a
background thread with its own event loop, so a whole stack started in other processes can call them
while the tests (each on its own loop) read what they received.

Each request is checked by the same checker the platform unit tests use; a failed check is kept in
`errors` (the test asserts there are none) and answered with a 400 in the platform's own format. The
OneBot checker refuses any `file` field that is not `base64://` bytes or a OneBot file id (a scheme,
a path or a URL would be read or fetched by the implementation itself).
Per chat, a test can script answers (a 429 once, a permanent error every time) before the checker.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from tests.connections.dingtalk_stream import StreamGateway
from tests.platforms.conftest import PNG, Answer, FakeApi, Seen
from tests.platforms.test_dingtalk import GROUP_PATH as DINGTALK_GROUP
from tests.platforms.test_dingtalk import PRIVATE_PATH as DINGTALK_PRIVATE
from tests.platforms.test_dingtalk import TOKEN_PATH as DINGTALK_TOKEN
from tests.platforms.test_dingtalk import UPLOAD_PATH as DINGTALK_UPLOAD
from tests.platforms.test_dingtalk import DingTalkStandIn
from tests.platforms.test_lark import LarkStandIn
from tests.platforms.test_onebot import check_onebot
from tests.platforms.test_qqbot import QQStandIn
from tests.platforms.test_slack import BOT_TOKEN as SLACK_TOKEN
from tests.platforms.test_slack import check_slack
from tests.platforms.test_telegram import TOKEN as TELEGRAM_TOKEN
from tests.platforms.test_telegram import check_telegram_request
from tests.platforms.test_wecom import WeComStandIn

LARK_MESSAGES = "/open-apis/im/v1/messages"
LARK_IMAGES = "/open-apis/im/v1/images"
LARK_TOKEN = "/open-apis/auth/v3/tenant_access_token/internal"

# The paths whose successful call is a message shown in the chat, per platform.
MESSAGE_PATHS: dict[str, tuple[str, ...]] = {
    "onebot": ("/send_private_msg", "/send_group_msg"),
    "telegram": tuple(f"/bot{TELEGRAM_TOKEN}/{m}" for m in ("sendMessage", "sendPhoto", "sendDocument")),
    "lark": (LARK_MESSAGES,),  # and LARK_MESSAGES/{message_id}/reply
    "slack": ("/chat.postMessage", "/files.completeUploadExternal"),
    "dingtalk": (DINGTALK_PRIVATE, DINGTALK_GROUP),
    "wecom": ("/cgi-bin/message/send", "/cgi-bin/appchat/send", "/cgi-bin/aibot/response"),
    "qqbot": (),  # every `…/messages` path (they carry the chat's id)
}

# What a failed stand-in check answers: a permanent error in the platform's format, never a retry.
_CHECK_FAILED: dict[str, Answer] = {
    "onebot": (200, {"status": "failed", "retcode": 100, "data": None, "message": "stand-in check failed"}),
    "telegram": (400, {"ok": False, "error_code": 400, "description": "Bad Request: stand-in check failed"}),
    "lark": (400, {"code": 230001, "msg": "stand-in check failed"}),
    "slack": (200, {"ok": False, "error": "invalid_arguments"}),
    "dingtalk": (400, {"code": "invalidParameter", "message": "stand-in check failed"}),
    "wecom": (200, {"errcode": 40058, "errmsg": "stand-in check failed"}),
    "qqbot": (400, {"code": 12002, "message": "stand-in check failed"}),
}


@dataclass
class Call:
    platform: str
    chat: str | None
    seen: Seen
    status: int
    answer: Any  # the body the stand-in answered
    at: float  # time.monotonic()

    @property
    def path(self) -> str:
        return self.seen.path

    @property
    def body(self) -> dict[str, Any]:
        if self.seen.json is not None:
            return dict(self.seen.json)
        return dict(self.seen.form)

    @property
    def accepted(self) -> bool:
        """HTTP 200 and a body that says so (OneBot, Lark and Slack report errors with HTTP 200)."""
        if self.status != 200:
            return False
        answer = self.answer if isinstance(self.answer, dict) else {}
        if self.platform == "onebot":
            return answer.get("status") in ("ok", "async")
        if self.platform == "lark":
            return answer.get("code") == 0
        if self.platform == "dingtalk":
            return "processQueryKey" in answer or answer.get("errcode") == 0 or "accessToken" in answer
        if self.platform == "wecom":
            return answer.get("errcode") == 0
        if self.platform in ("telegram", "slack"):
            return answer.get("ok") is True or isinstance(self.answer, str)  # the upload answers text
        if self.platform == "qqbot":
            return "id" in answer or "file_info" in answer
        return False

    @property
    def is_message(self) -> bool:
        return _is_message_path(self.platform, self.path)


def _is_message_path(platform: str, path: str) -> bool:
    if platform == "qqbot":
        return path.endswith("/messages")
    return path in MESSAGE_PATHS[platform] or (platform == "lark" and path.endswith("/reply"))


class StandIns:
    """The stand-ins; `url(platform)` is what a bot's `api_base` points at."""

    def __init__(self) -> None:
        names = ("onebot", "telegram", "lark", "slack", "wecom", "qqbot", "dingtalk")
        self.apis = {name: FakeApi() for name in names}
        self.lark = LarkStandIn(self.apis["lark"])  # its checkers; `_routes` serves them wrapped
        self.wecom = WeComStandIn(self.apis["wecom"])
        self.qq = QQStandIn(self.apis["qqbot"])  # likewise; `qq.received(msg_id)` before a webhook
        self.dingtalk = DingTalkStandIn(self.apis["dingtalk"])
        # DingTalk's Stream gateway, serving the robot OpenAPI stand-in on its other paths.
        self.dingtalk_stream = StreamGateway()
        self.calls: list[Call] = []
        self.errors: list[str] = []
        # Waits until the stack calling these stand-ins has nothing in flight (see `settle`).
        self.idle: Callable[[], Awaitable[None]] | None = None
        self._lock = threading.Lock()
        self._script: dict[tuple[str, str], tuple[deque[Answer], bool]] = {}
        self._lark_chat_of: dict[str, str] = {}  # replied-to message id -> chat id
        self._uploads = itertools.count(1)
        self.slack_uploads: dict[str, list[bytes]] = {}  # file id -> the bytes uploaded to its URL
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="platform-standins", daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> StandIns:
        self._thread.start()
        for api in self.apis.values():
            self._run(api.start())
        self._run(self.dingtalk_stream.start(other_paths=self.apis["dingtalk"]._handle))  # noqa: SLF001
        self._routes()
        return self

    def stop(self) -> None:
        try:
            self._run(self.dingtalk_stream.stop())
            for api in self.apis.values():
                self._run(api.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the stand-ins' loop (a push over the Stream gateway's socket)."""
        return self._run(coro)

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=15)

    def url(self, platform: str) -> str:
        return self.apis[platform].url

    # -- scripting --------------------------------------------------------------------------------
    def script(self, platform: str, chat: str, *answers: Answer, sticky: bool = False) -> None:
        """Answer the next calls for `chat` with `answers` in order (the last one forever if `sticky`)
        instead of the checker's success."""
        with self._lock:
            self._script[(platform, chat)] = (deque(answers), sticky)

    def expect_lark_reply(self, message_id: str, chat_id: str) -> None:
        """Route `POST /open-apis/im/v1/messages/{message_id}/reply` (a reply to that message in `chat_id`)."""
        with self._lock:
            self._lark_chat_of[message_id] = chat_id
        self.apis["lark"].on(f"{LARK_MESSAGES}/{message_id}/reply", self._wrap("lark", self.lark.create))

    # -- reading ----------------------------------------------------------------------------------
    def calls_for(self, platform: str, chat: str, *, messages_only: bool = True) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self.calls
                if c.platform == platform and c.chat == chat and (c.is_message or not messages_only)
            ]

    def delivered(self, platform: str, chat: str) -> list[Call]:
        """Message calls for `chat` that the stand-in accepted."""
        return [c for c in self.calls_for(platform, chat) if c.accepted]

    def all_calls(self) -> list[Call]:
        with self._lock:
            return list(self.calls)

    async def wait_for(
        self, platform: str, chat: str, count: int = 1, *, within: float = 30.0, delivered: bool = True
    ) -> list[Call]:
        """Wait until `chat` received at least `count` (delivered) message calls; return them all."""
        deadline = time.monotonic() + within
        while True:
            got = self.delivered(platform, chat) if delivered else self.calls_for(platform, chat)
            if len(got) >= count:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{platform} {chat}: {len(got)} of {count} calls after {within}s; "
                    f"all calls: {[(c.platform, c.chat, c.path, c.status) for c in self.all_calls()]}; "
                    f"stand-in errors: {self.errors}"
                )
            await asyncio.sleep(0.05)

    async def settle(self) -> list[Call]:
        """All calls once the stack sending to these stand-ins has nothing in flight (to prove
        'exactly one'); `idle` is set by whoever starts that stack."""
        assert self.idle is not None, "StandIns.idle is not set: no stack to wait for"
        await self.idle()
        return self.all_calls()

    # -- handlers ---------------------------------------------------------------------------------
    def _routes(self) -> None:
        onebot, telegram, lark, slack = (self.apis[n] for n in ("onebot", "telegram", "lark", "slack"))
        for path in MESSAGE_PATHS["onebot"]:
            onebot.on(path, self._wrap("onebot", check_onebot))
        for path in MESSAGE_PATHS["telegram"]:
            telegram.on(path, self._wrap("telegram", check_telegram_request))
        telegram.on(f"/bot{TELEGRAM_TOKEN}/sendChatAction", self._wrap("telegram", _telegram_chat_action))
        lark.on(LARK_TOKEN, self._wrap("lark", self.lark.token))
        lark.on(LARK_MESSAGES, self._wrap("lark", self.lark.create))
        lark.on(LARK_IMAGES, self._wrap("lark", self.lark.image))
        slack.on("/chat.postMessage", self._wrap("slack", check_slack))
        slack.on("/files.getUploadURLExternal", self._wrap("slack", self._slack_upload_url))
        slack.on("/files.completeUploadExternal", self._wrap("slack", _slack_complete_upload))
        dingtalk = self.apis["dingtalk"]
        dingtalk.on(DINGTALK_TOKEN, self._wrap("dingtalk", self.dingtalk.token))
        dingtalk.on(DINGTALK_UPLOAD, self._wrap("dingtalk", self.dingtalk.upload))
        for path in MESSAGE_PATHS["dingtalk"]:
            dingtalk.on(path, self._wrap("dingtalk", self.dingtalk.send))
        wecom = self.apis["wecom"]
        wecom.on("/cgi-bin/gettoken", self._wrap("wecom", self.wecom.token))
        wecom.on("/cgi-bin/media/upload", self._wrap("wecom", self.wecom.upload))
        for path in ("/cgi-bin/message/send", "/cgi-bin/appchat/send"):
            wecom.on(path, self._wrap("wecom", self.wecom.send))
        wecom.on("/cgi-bin/aibot/response", self._wrap("wecom", self.wecom.respond))
        qqbot = self.apis["qqbot"]
        qqbot.on("/app/getAppAccessToken", self._wrap("qqbot", self.qq.token))
        for prefix in qqbot.prefixes:
            qqbot.prefixes[prefix] = self._wrap("qqbot", self.qq.route)

    def _wrap(self, platform: str, checker: Callable[[Seen], Any]) -> Callable[[Seen], Answer]:
        def handle(seen: Seen) -> Answer:
            chat = self._chat_of(platform, seen)
            with self._lock:
                scripted = None
                if chat is not None and _is_message_path(platform, seen.path):  # not typing, not uploads
                    scripted = self._script.get((platform, chat))
                answer: Answer | None = None
                if scripted is not None and scripted[0]:
                    queue, sticky = scripted
                    answer = queue[0] if sticky and len(queue) == 1 else queue.popleft()
            if answer is None:
                try:
                    answer = checker(seen)
                except Exception as exc:  # a request the real platform would refuse
                    with self._lock:
                        self.errors.append(f"{platform} {seen.path}: {exc!r} body={seen.body[:500]!r} form={seen.form}")
                    answer = _CHECK_FAILED[platform]
            with self._lock:
                self.calls.append(Call(platform, chat, seen, answer[0], answer[1], time.monotonic()))
            return answer

        return handle

    def _chat_of(self, platform: str, seen: Seen) -> str | None:
        body = seen.json if isinstance(seen.json, dict) else dict(seen.form)
        if platform == "telegram":
            chat = body.get("chat_id")
            return None if chat is None else str(chat)
        if platform == "onebot":
            if "group_id" in body:
                return f"group_{body['group_id']}"
            return f"private_{body['user_id']}" if "user_id" in body else None
        if platform == "lark":
            if seen.path.endswith("/reply"):
                with self._lock:
                    return self._lark_chat_of.get(seen.path.split("/")[-2])
            receive_id = body.get("receive_id")
            return str(receive_id) if receive_id is not None else None
        if platform == "slack":
            chat = body.get("channel") or body.get("channel_id")
            return str(chat) if chat is not None else None
        if platform == "dingtalk":
            users = body.get("userIds")
            chat = body.get("openConversationId") or (users[0] if isinstance(users, list) and users else None)
            return str(chat) if chat is not None else None
        if platform == "wecom":  # an AI bot answer: the e2e tests use the chat id as response code
            chat = body.get("touser") or body.get("chatid") or seen.query.get("response_code")
            return str(chat) if chat is not None else None
        if platform == "qqbot":  # the chat id Switchboard uses: `<scene>:<id>` from the path
            parts = seen.path.strip("/").split("/")
            scenes = {"groups": "group", "users": "c2c", "channels": "channel", "dms": "dm"}
            if parts[0] == "v2" and len(parts) > 2:
                parts = parts[1:]
            return f"{scenes[parts[0]]}:{parts[1]}" if parts[0] in scenes and len(parts) > 1 else None
        return None

    def _slack_upload_url(self, seen: Seen) -> Answer:
        """`files.getUploadURLExternal`: a form with filename and length; the upload URL it gives
        accepts exactly that many bytes."""
        assert seen.headers["authorization"] == f"Bearer {SLACK_TOKEN}"
        assert seen.headers["content-type"].startswith("application/x-www-form-urlencoded")
        assert set(seen.form) == {"filename", "length"} and int(seen.form["length"]) > 0
        n = next(self._uploads)
        file_id, path = f"F0UPLOAD{n:04d}", f"/upload/v1/u{n}"
        length = int(seen.form["length"])
        uploaded: list[bytes] = []

        def upload(data: Seen) -> Answer:
            received = data.body or b"".join(f[1] for f in data.files.values())
            assert len(received) == length, (len(received), length)
            uploaded.append(received)
            return 200, f"OK - {len(received)}"

        self.apis["slack"].on(path, self._wrap("slack", upload))
        self.slack_uploads[file_id] = uploaded
        return 200, {"ok": True, "upload_url": f"{self.url('slack')}{path}", "file_id": file_id}


def _telegram_chat_action(seen: Seen) -> Answer:
    assert seen.path == f"/bot{TELEGRAM_TOKEN}/sendChatAction" and seen.json["action"] == "typing"
    return 200, {"ok": True, "result": True}


def _slack_complete_upload(seen: Seen) -> Answer:
    assert seen.headers["authorization"] == f"Bearer {SLACK_TOKEN}"
    body = seen.json
    assert body["channel_id"].startswith(("C", "D")) and body["files"] and body["files"][0]["id"].startswith("F0")
    return 200, {"ok": True, "files": [{"id": f["id"]} for f in body["files"]]}


__all__ = ["PNG", "Call", "StandIns"]
