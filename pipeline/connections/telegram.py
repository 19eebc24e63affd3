"""Telegram Bot API `getUpdates` long polling (transport `polling`), dialed by the lease's holder.

Telegram keeps a bot's updates until a `getUpdates` call with `offset` above their `update_id`
confirms them. The holder polls from the offset committed in Redis, hands each update to the same
parser a webhook update goes through (`TelegramPlatform.parse`), waits until the broker has
acknowledged what they produced, and only then commits `last update_id + 1` under its lease (a
stale holder cannot move it); the next poll, by this holder or the next one, confirms them. A
holder that dies in between leaves them unconfirmed: the next holder reads them again and ingest
drops the copies by message id.

Telegram answers a second poller of the same token with 409 Conflict (one of the two polls ends):
the lease keeps Switchboard to one, so a conflict is another deployment or a stray process using
the token; it is logged, counted, backed off and the lease re-checked. A webhook still set makes
every poll a 409 too: deleted at start only when the bot says `delete_webhook = true`.
The token is in the URL path: it is cut out of everything logged or raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, ClassVar

import aiohttp

from pipeline import metrics
from pipeline.platforms._common import base_url
from pipeline.platforms.telegram import DEFAULT_API_BASE
from pipeline.settings import BotConfig

from .base import EVENT, Connection, DialContext, Link, Transport
from .exceptions import ConnectionsError, PollFailed

log = logging.getLogger(__name__)

# Only the updates the parser turns into messages (Telegram keeps this choice for the bot).
ALLOWED_UPDATES = ("message",)
_LIMIT = 100
# A poll's HTTP request may take this much longer than its long-poll timeout before it counts as lost.
_HTTP_SLACK_SECONDS = 15.0
_MAX_BACKOFF = 30.0
_WEBHOOK_BACKOFF = 60.0  # a webhook set stays set until someone acts: ask less often


class _Refused(ConnectionsError):
    """A poll that failed and may be tried again after `backoff`; `reason` is a metric label."""

    def __init__(self, reason: str, detail: str, backoff: float | None = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.backoff = backoff


def redact(text: str, token: str) -> str:
    return text.replace(token, "<token>") if token else text


class _BotApi:
    """Calls of one bot's Bot API, `https://api.telegram.org/bot<token>/<method>`."""

    def __init__(self, bot: BotConfig, http: aiohttp.ClientSession) -> None:
        self.bot = bot
        self.http = http
        self.token = bot.secret("token") or ""
        self.root = f"{base_url(bot, DEFAULT_API_BASE)}/bot{self.token}"

    async def call(self, method: str, params: dict[str, Any], timeout: float) -> Any:
        """The `result` of a successful call, or `_Refused` / `PollFailed`."""
        try:
            async with self.http.post(
                f"{self.root}/{method}", json=params, timeout=aiohttp.ClientTimeout(total=timeout)
            ) as response:
                status, body = response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise _Refused("network", redact(f"{type(exc).__name__}: {exc}", self.token)[:300]) from None
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
            raise _Refused("bad_response", f"HTTP {status}: not a Bot API answer")
        if data["ok"]:
            return data.get("result")
        error_code = data.get("error_code")
        code: int = error_code if isinstance(error_code, int) else status
        description = redact(str(data.get("description") or ""), self.token)[:300]
        parameters = data.get("parameters")
        retry_after = parameters.get("retry_after") if isinstance(parameters, dict) else None
        if code == 409:
            reason = "webhook_active" if "webhook" in description.lower() else "conflict"
            raise _Refused(reason, description)
        if code == 429:
            backoff = float(retry_after) if isinstance(retry_after, int | float) else None
            raise _Refused("rate_limited", description, backoff)
        if code >= 500:
            raise _Refused("server_error", description)
        if code in (401, 404):  # 404: Telegram's answer to a token of the wrong shape
            metrics.CONNECTION_POLL_ERRORS.labels(self.bot.platform, self.bot.bot_id, "unauthorized").inc()
            raise PollFailed(f"{method}: HTTP {code} {description} (is the bot's token right?)")
        raise _Refused("bad_request", f"{method}: {description}")


class TelegramPoller(Connection):
    """One holder's polling of a bot: `run` polls until closed; no actions (replies go over HTTP)."""

    transport = "polling"
    channels = frozenset({EVENT})

    def __init__(self, api: _BotApi) -> None:
        self.api = api
        self.bot = api.bot
        self.timeout = api.bot.poll_timeout_seconds
        self._closed = asyncio.Event()
        self._poll: asyncio.Task[Any] | None = None

    async def run(self, link: Link) -> None:
        offset = await link.committed_offset()
        failures = 0
        while not self._closed.is_set():
            params: dict[str, Any] = {"timeout": self.timeout, "limit": _LIMIT, "allowed_updates": ALLOWED_UPDATES}
            if offset is not None:
                params["offset"] = offset
            self._poll = asyncio.ensure_future(self.api.call("getUpdates", params, self.timeout + _HTTP_SLACK_SECONDS))
            try:
                result = await self._poll
            except asyncio.CancelledError:
                if self._closed.is_set():
                    return  # closed while waiting for updates
                raise
            except _Refused as refused:
                failures += 1
                if not await self._refused(refused, failures, link):
                    return
                continue
            if not isinstance(result, list):  # not what getUpdates answers: never poll in a tight loop
                failures += 1
                if not await self._refused(_Refused("bad_response", "result is not a list"), failures, link):
                    return
                continue
            failures = 0
            updates = [u for u in result if isinstance(u, dict)]
            if not updates:
                continue
            acknowledgements = [await link.submit(json.dumps(u, ensure_ascii=False).encode()) for u in updates]
            # Raises when the broker could not take them: the offset stays, they are polled again.
            await asyncio.gather(*acknowledgements)
            ids = [u["update_id"] for u in updates if isinstance(u.get("update_id"), int)]
            if not ids:
                continue
            offset = max(ids) + 1
            if not await link.commit_offset(offset):
                log.warning("%s/%s: the lease was lost; polling stops", self.bot.platform, self.bot.bot_id)
                return

    async def _refused(self, refused: _Refused, failures: int, link: Link) -> bool:
        """Count and log a failed poll, wait, and say whether to poll again (the lease still held)."""
        platform, bot_id = self.bot.platform, self.bot.bot_id
        metrics.CONNECTION_POLL_ERRORS.labels(platform, bot_id, refused.reason).inc()
        cap = _WEBHOOK_BACKOFF if refused.reason == "webhook_active" else _MAX_BACKOFF
        backoff = refused.backoff if refused.backoff is not None else min(cap, 0.5 * 2**failures)
        if refused.reason == "conflict":
            log.error(
                "%s/%s: Telegram says another getUpdates poller uses this bot's token (%s). Switchboard "
                "polls from one worker at a time: look for another deployment or process with the same "
                "token. Polling again in %.0f s, if this worker still holds the bot's lease",
                platform,
                bot_id,
                refused.detail,
                backoff,
            )
        elif refused.reason == "webhook_active":
            log.error(
                "%s/%s: a webhook is set for this bot, so Telegram refuses getUpdates (%s). Set "
                "delete_webhook = true on the bot to have it deleted when polling starts, or call "
                "deleteWebhook yourself. Trying again in %.0f s",
                platform,
                bot_id,
                refused.detail,
                backoff,
            )
        else:
            log.warning("%s/%s: getUpdates failed (%s); again in %.1f s", platform, bot_id, refused, backoff)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(backoff):
                await self._closed.wait()
        if self._closed.is_set():
            return False
        if refused.reason == "network":
            metrics.CONNECTION_RECONNECTS.labels(platform, self.transport).inc()
        if refused.reason in ("conflict", "webhook_active") and not await link.still_held():
            log.warning("%s/%s: the lease was lost; polling stops", platform, bot_id)
            return False
        return True

    async def close(self) -> None:
        self._closed.set()
        if self._poll is not None and not self._poll.done():
            self._poll.cancel()  # a long poll would otherwise run on past the lease


class TelegramPolling(Transport):
    """Switchboard polls the Bot API (`api_base`, default `https://api.telegram.org`)."""

    platform: ClassVar[str] = "telegram"
    name: ClassVar[str] = "polling"
    dialed: ClassVar[bool] = True
    channels: ClassVar[frozenset[str]] = frozenset({EVENT})

    async def connect(self, bot: BotConfig, context: DialContext) -> Connection:
        """`getMe` (the token works), then `deleteWebhook` when the bot opted in."""
        api = _BotApi(bot, context.http)
        try:
            await api.call("getMe", {}, _HTTP_SLACK_SECONDS)
            if bot.delete_webhook:
                # Pending updates are kept: polling reads them next.
                await api.call("deleteWebhook", {"drop_pending_updates": False}, _HTTP_SLACK_SECONDS)
                log.info("%s/%s: webhook deleted (delete_webhook = true)", bot.platform, bot.bot_id)
        except _Refused as refused:
            metrics.CONNECTION_POLL_ERRORS.labels(bot.platform, bot.bot_id, refused.reason).inc()
            log.warning("%s/%s: polling could not start: %s", bot.platform, bot.bot_id, refused)
            raise PollFailed(str(refused)) from None
        except PollFailed as failed:
            log.error("%s/%s: polling could not start: %s", bot.platform, bot.bot_id, failed)
            raise
        return TelegramPoller(api)


TRANSPORTS: dict[tuple[str, str], Transport] = {("telegram", "polling"): TelegramPolling()}


__all__ = ["ALLOWED_UPDATES", "TRANSPORTS", "PollFailed", "TelegramPoller", "TelegramPolling", "redact"]
