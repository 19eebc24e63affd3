"""Refused early: a trigger over a turn limit dropped where it comes in, before it is a record.

Ingest decides every limit, shared by all workers through Redis (`pipeline.controls.limits`). A
window's counter only grows, so once ingest has found a user, a chat or a bot over a turn limit,
every later trigger of that user (chat) is over it too until the window turns. A bot that drops
what is over its limits (`over_limit = "drop"`, the default) keeps nothing of such a message: no
turn, no context entry, and the window's one notice is decided. So the edge that parsed it (a
webhook, a held connection's frame) may drop it at once: no `im.inbound` record, no broker round
trip, no ingest step, no limits script. Under a flood that is most of what a refused message cost.

Left to ingest, as before: chat commands (never limited), the bot's admins (exempt), messages the
moderation lists match (their own decision), bots that hold what is over a limit (kept as context),
and every window no worker's ingest has yet found over its limit. Each worker tells the others
what its ingest found (`RefusalBroadcast`, Redis pub/sub): a webhook may reach any worker, and the
chat's partition is one worker's. Best effort: a worker that missed a message takes the usual path
for that chat, and ingest refuses there. An entry ends a little before its window does, so a clock
a few milliseconds off never refuses a message the next window would take.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, get_args

from pipeline import metrics
from pipeline.addressing import parse_chat_command, trigger_reason
from pipeline.controls.limits import LimitScope
from pipeline.records import InboundMessage
from pipeline.settings import BotConfig
from pipeline.state import RedisClient, RedisPy, listen

log = logging.getLogger(__name__)

# (platform:bot, scope, subject): the user id for the user limit, the chat id for the chat's and,
# since the bot limit's notice is per chat, for the bot's too (every chat is told once).
_Key = tuple[str, LimitScope, str]
_SCOPES: tuple[str, ...] = get_args(LimitScope)
_LONGEST_MS = 32 * 86_400_000  # past the longest window (31 days): not an entry of ours
_POLL_SECONDS = 1.0  # the subscription's reads: how soon a stop is seen if a cancellation is not


class EarlyRefusals:
    """The windows this worker's ingest found over a turn limit, until each ends, for the edge."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._until: dict[_Key, int] = {}  # → epoch ms after which the edge leaves it to ingest
        self._max_entries = max_entries
        # Told each entry this worker's ingest adds (as `learn` reads it): the broadcast's publish.
        self.on_noted: Callable[[str], None] | None = None

    def __len__(self) -> int:
        return len(self._until)

    def note(self, bot: BotConfig, message: InboundMessage, scope: LimitScope, now_ms: int) -> None:
        """Ingest refused `message` for `scope`'s limit in the window of `now_ms` (its limits clock)."""
        limits = bot.limits
        window = limits.window(scope)
        if window is None or limits.over_limit != "drop":
            return
        window_ms = window.per_seconds * 1000
        end = (now_ms // window_ms + 1) * window_ms
        key = (_bot_key(message), scope, message.sender.user_id if scope == "user" else message.chat_id)
        until = end - min(1000, window_ms // 10)
        if self._until.get(key) == until:
            return  # known (from this worker, or told by another)
        self._add(key, until, now_ms)
        if self.on_noted is not None:
            self.on_noted(json.dumps([*key, until]))

    def learn(self, entry: str | bytes, now_ms: int) -> bool:
        """An entry another worker's ingest added (`on_noted`'s text); False when it is not one."""
        try:
            bot_key, scope, subject, until = json.loads(entry)
        except (ValueError, TypeError):
            return False
        if not (
            isinstance(bot_key, str)
            and scope in _SCOPES
            and isinstance(subject, str)
            and type(until) is int
            and now_ms < until < now_ms + _LONGEST_MS
        ):
            return False
        self._add((bot_key, scope, subject), until, now_ms)
        return True

    def _add(self, key: _Key, until: int, now_ms: int) -> None:
        self._until.pop(key, None)  # re-inserted last: the oldest are first to go when full
        self._until[key] = until
        if len(self._until) > self._max_entries:
            self._prune(now_ms)

    def refuses(self, bot: BotConfig, message: InboundMessage, now_ms: int) -> LimitScope | None:
        """The limit `message` is over, if ingest would refuse it and drop it without a word."""
        if not self._until:
            return None
        limits = bot.limits
        if limits.over_limit != "drop" or message.sender.is_admin or message.sender.user_id in bot.admins:
            return None
        if parse_chat_command(message.text) is not None or trigger_reason(message, bot) is None:
            return None  # a command, or chatter (the context window's business)
        if bot.moderation.lists and bot.moderation.matches(message.text):
            return None  # moderated first, as ingest does
        bot_key = _bot_key(message)
        chat, user = message.chat_id, message.sender.user_id
        subjects: tuple[tuple[LimitScope, str], ...] = (("user", user), ("chat", chat), ("bot", chat))
        for scope, subject in subjects:
            until = self._until.get((bot_key, scope, subject))
            if until is not None and now_ms < until:
                return scope
        return None

    def screen(self, bot: BotConfig, messages: Sequence[InboundMessage]) -> list[InboundMessage]:
        """The messages to produce: those refused here are counted and logged, and left out."""
        if not self._until:
            return list(messages)
        now = int(time.time() * 1000)
        kept = []
        for message in messages:
            scope = self.refuses(bot, message, now)
            if scope is None:
                kept.append(message)
                continue
            metrics.RATE_LIMITED.labels(message.platform, message.bot_id, scope, "limited").inc()
            log.info(
                "edge: %s message %s over the %s limit (limited, refused before ingest)",
                message.conversation_key,
                message.message_id,
                scope,
            )
        return kept

    def _prune(self, now_ms: int) -> None:
        for key in [k for k, until in self._until.items() if until <= now_ms]:
            del self._until[key]
        while len(self._until) > self._max_entries:
            del self._until[next(iter(self._until))]


def _bot_key(message: InboundMessage) -> str:
    return f"{message.platform}:{message.bot_id}"


class RefusalBroadcast:
    """Every worker's early refusals to every worker's edge, over Redis pub/sub: an entry its
    ingest adds is published (the stores' client), and what the others publish is learnt (a
    subscription on a redis-py client's connection, resubscribed after a break). Nothing depends
    on it: a lost message only leaves that chat's triggers to ingest."""

    def __init__(self, refusals: EarlyRefusals, redis: RedisClient, subscriber: RedisPy, channel: str) -> None:
        self.refusals = refusals
        self.redis = redis
        self.subscriber = subscriber
        self.channel = channel
        self.subscribed = asyncio.Event()
        self._publishing: set[asyncio.Task[Any]] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    def start(self) -> None:
        self.refusals.on_noted = self._publish
        self._task = asyncio.create_task(self._listen(), name="refusal-broadcast")

    async def stop(self) -> None:
        self.refusals.on_noted = None
        self._closed = True
        for publishing in self._publishing:
            publishing.cancel()
        await asyncio.gather(*self._publishing, return_exceptions=True)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # redis-py can absorb a cancellation inside a read (the read then returns nothing), so
            # the loop also ends by itself within a poll once it sees `_closed`.
            await asyncio.wait({task}, timeout=_POLL_SECONDS + 2)

    def _publish(self, entry: str) -> None:
        task = asyncio.create_task(self.redis.execute("PUBLISH", self.channel, entry))
        self._publishing.add(task)
        task.add_done_callback(self._published)

    def _published(self, task: asyncio.Task[Any]) -> None:
        self._publishing.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("refused early: publishing an entry failed (%s)", type(task.exception()).__name__)

    async def _listen(self) -> None:
        await listen(
            self.subscriber,
            self.channel,
            self._learn,
            subscribed=self.subscribed,
            on_lost=self._lost,
            running=lambda: not self._closed,
            poll_seconds=_POLL_SECONDS,
        )

    def _learn(self, entry: str | bytes) -> None:
        if not self.refusals.learn(entry, int(time.time() * 1000)):
            log.warning("refused early: not an entry on %s; ignored", self.channel)

    @staticmethod
    def _lost(exc: Exception) -> None:
        log.warning("refused early: subscription lost (%s); resubscribing", type(exc).__name__)
