"""Actions over a held connection, asked for by any worker.

The sender (egress, on whichever worker the outbound record landed) pushes a request onto the bot's
queue in Redis and waits on a reply list of its own. The holder takes requests off the queue, checks
its fencing token (a holder whose lease was taken gives the request back and stops), runs the
action over its connection and pushes the answer. No worker talks to another directly.

Request ids are stable per platform call (`<outbound id>:<call index>`): a sender that gave up
waiting asks again with the same id, and an action the platform answered for good is answered
from Redis instead of running twice. One still running on the holder is joined, not repeated. The
claim marks an action as being sent before it is written to the socket: when a holder dies (or the
socket closes) after writing it and before its answer, nobody knows whether the platform posted
it, and it is answered `outcome_unknown` (final: dead-lettered) instead of being sent twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pipeline import metrics
from pipeline.settings import BotConfig
from pipeline.state import ConnectionStore
from pipeline.state.exceptions import UNAVAILABLE

from ._lease import HeldLease
from .base import API, ActionAnswer, Connection

log = logging.getLogger(__name__)

# A request older than its sender's deadline is skipped (its sender asks again, with the same id);
# wall clocks of two hosts differ, so only one this much older.
_CLOCK_SLACK_MS = 2000
# Actions one holder runs at once per bot (its connection multiplexes them).
_CONCURRENT_ACTIONS = 64


@dataclass(frozen=True)
class ActionRequest:
    id: str
    reply: str
    action: str
    params: dict[str, Any]
    deadline_ms: int

    def encode(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def decode(cls, raw: str) -> ActionRequest:
        data = json.loads(raw)
        return cls(
            id=str(data["id"]),
            reply=str(data["reply"]),
            action=str(data["action"]),
            params=dict(data["params"]),
            deadline_ms=int(data["deadline_ms"]),
        )


def encode_answer(answer: ActionAnswer) -> str:
    body: dict[str, Any] = {"final": answer.final}
    if answer.response is not None:
        body["response"] = dict(answer.response)
    if answer.error:
        body["error"], body["detail"] = answer.error, answer.detail[:500]
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


def decode_answer(raw: str) -> ActionAnswer:
    try:
        data = json.loads(raw)
        response = data.get("response")
        return ActionAnswer(
            response=response if isinstance(response, dict) else None,
            error=str(data.get("error", "")),
            detail=str(data.get("detail", "")),
            final=bool(data.get("final")),
        )
    except (ValueError, AttributeError):
        return ActionAnswer(error="bad_answer", detail=raw[:200])


class ActionRouter:
    """The sender's side: runs an action over the bot's held connection, wherever it is held."""

    def __init__(self, store: ConnectionStore, timeout: float) -> None:
        self.store = store
        self.timeout = timeout

    async def call(
        self, bot: BotConfig, action: str, params: Mapping[str, Any], request_id: str, *, channel: str = API
    ) -> ActionAnswer:
        """The holder's answer; `error="no_holder"` or `"timeout"` when none came in time (the caller
        retries, with the same `request_id`)."""
        request = ActionRequest(
            id=request_id,
            reply=uuid.uuid4().hex,
            action=action,
            params=dict(params),
            deadline_ms=int(time.time() * 1000 + self.timeout * 1000),
        )
        ttl_ms = int(self.timeout * 3000)
        await self.store.push_action(bot.platform, bot.bot_id, request.encode(), ttl_ms)
        raw = await self.store.wait_answer(request.reply, self.timeout)
        if raw is not None:
            metrics.CONNECTION_ACTIONS.labels(bot.platform, "answered").inc()
            return decode_answer(raw)
        [holder] = await self.store.holders([(bot.platform, bot.bot_id, channel)])
        error = "no_holder" if holder is None or holder.state != "up" else "timeout"
        metrics.CONNECTION_ACTIONS.labels(bot.platform, error).inc()
        detail = f"no worker holds {bot.platform}/{bot.bot_id}" if error == "no_holder" else ""
        return ActionAnswer(error=error, detail=detail or f"no answer from the holder within {self.timeout:g} s")


class ActionServer:
    """The holder's side for one held connection: serves the bot's queue until the lease is lost or
    the connection ends."""

    def __init__(
        self,
        store: ConnectionStore,
        bot: BotConfig,
        connection: Connection,
        lease: HeldLease,
        stop: asyncio.Event,
        *,
        hold_timeout: float,
    ) -> None:
        self.store = store
        self.bot = bot
        self.connection = connection
        self.lease = lease
        self.stop = stop  # set when the connection ended
        # How long the holder waits for the platform's response: longer than a sender waits, since
        # a sender that gave up asks again (with the same id) and joins the action still running.
        self.hold_timeout = hold_timeout
        self._running: dict[str, asyncio.Future[ActionAnswer]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(_CONCURRENT_ACTIONS)

    async def serve(self) -> None:
        platform, bot_id = self.bot.platform, self.bot.bot_id
        try:
            # Never cancelled while it waits (a request popped by a cancelled wait would be lost until
            # its sender asks again): it looks at `stop` and the lease between waits of a second.
            while not (self.lease.lost.is_set() or self.stop.is_set()):
                try:
                    raw = await self.store.next_action(platform, bot_id, timeout=1.0)
                except UNAVAILABLE:  # the lease runs out too if Redis stays away
                    await asyncio.sleep(0.5)
                    continue
                if raw is None:
                    continue
                if self.lease.lost.is_set() or self.stop.is_set():
                    await self.store.give_back(platform, bot_id, raw)
                    return
                await self._slots.acquire()
                task = asyncio.create_task(self._handle(raw))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            # Answers being waited for are still wanted: let the actions in flight finish.
            if self._tasks:
                await asyncio.wait(self._tasks, timeout=5.0)

    async def _handle(self, raw: str) -> None:
        platform = self.bot.platform
        try:
            try:
                request = ActionRequest.decode(raw)
            except (ValueError, KeyError, TypeError):
                metrics.CONNECTION_ACTIONS.labels(platform, "malformed").inc()
                log.warning("%s/%s: an action request that is not one was dropped", platform, self.bot.bot_id)
                return
            if request.deadline_ms + _CLOCK_SLACK_MS < time.time() * 1000:
                metrics.CONNECTION_ACTIONS.labels(platform, "expired").inc()
                return  # its sender gave up; it asks again with the same id
            claim = await self.store.claim_action(platform, self.bot.bot_id, API, self.lease.owner, request.id)
            if claim.kind == "fenced":
                metrics.CONNECTION_ACTIONS.labels(platform, "fenced").inc()
                # Lost before the request goes back: the serve loop, waiting on the same queue, may
                # pop it the moment it is back and must hand it on, not claim it again.
                self.lease.lose("taken")
                await self.store.give_back(platform, self.bot.bot_id, raw)
                return
            if claim.kind == "done" and claim.outcome is not None:
                metrics.CONNECTION_ACTIONS.labels(platform, "repeated").inc()
                await self._reply(request, claim.outcome, record=None)
                return
            running = self._running.get(request.id)
            if claim.kind == "mine" and running is not None:  # asked again while it runs: joined
                metrics.CONNECTION_ACTIONS.labels(platform, "joined").inc()
                await self._reply(request, encode_answer(await asyncio.shield(running)), record=None)
                return
            if claim.kind == "run":
                await self._run(request)
                return
            # Sent before (by an earlier holder, or by this one without recording how it ended), and
            # nobody knows whether the platform posted it: sending it again could post it twice.
            metrics.CONNECTION_ACTIONS.labels(platform, "outcome_unknown").inc()
            unknown = ActionAnswer(
                error="outcome_unknown",
                detail="sent by a holder that ended before its answer; not sent again (it may have been posted)",
                final=True,
            )
            await self._reply(request, encode_answer(unknown), record=True)
        except Exception:
            log.exception("%s/%s: an action failed in the holder", platform, self.bot.bot_id)
        finally:
            self._slots.release()

    async def _run(self, request: ActionRequest) -> None:
        """Send the action (marked as being sent by the claim), record how it ended, then answer its
        sender and any repeat that joined it meanwhile."""
        future: asyncio.Future[ActionAnswer] = asyncio.get_running_loop().create_future()
        self._running[request.id] = future
        try:
            answer = await self.connection.call(request.action, request.params, self.hold_timeout)
            metrics.CONNECTION_ACTIONS.labels(self.bot.platform, "run").inc()
            # Recorded before a repeat can find it not running: a repeat sees `done`, or joins.
            await self._reply(request, encode_answer(answer), record=answer.final)
            future.set_result(answer)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: a joiner may never come
            raise
        finally:
            # A repeat that found it not final and not running (`run` again) put its own future here.
            if self._running.get(request.id) is future:
                del self._running[request.id]

    async def _reply(self, request: ActionRequest, answer: str, *, record: bool | None) -> None:
        await self.store.answer(
            request.reply,
            answer,
            self._reply_ttl(),
            platform=self.bot.platform,
            bot_id=self.bot.bot_id,
            request_id=request.id,
            final=record,
        )

    def _reply_ttl(self) -> int:
        return int(max(self.lease.seconds, 10.0) * 1000)
