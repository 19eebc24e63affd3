"""Reply deadlines: a notice while it can still reach the chat, when a turn outlives the time its
platform allows for a reply to the user's message (QQ bot: the passive-reply window).

Past that deadline nothing reaches the chat (QQ refuses a message without a fresh `msg_id`), so the
notice goes shortly before it: `bot.reply_window_notice_seconds` before the deadline the platform
declares (`Platform.reply_deadline_ms`). Dispatch schedules a turn when it starts it (one sorted
set in Redis, see `DeadlineStore`), render unschedules it when the turn ends, and every worker
checks the set once a second: a turn due and still running gets the notice once (its outbound id
is derived from the turn, so a worker that dies mid-way leaves a claim that another one finishes,
and egress drops the repeat). Platforms without reply windows schedule nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pipeline.platforms import Platform
from pipeline.records import now_ms
from pipeline.segments.notices import NoticeKind
from pipeline.settings import BotConfig, Settings
from pipeline.state import State, TurnRecord

from ._ids import stable_id
from .notify import Notifier
from .outputs import Outputs

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 1.0
# A claimed entry not handled within this (its worker died) is due again for another worker.
CLAIM_MS = 10_000
CLAIM_BATCH = 100


def member(turn_id: str, conversation: str) -> str:
    """A turn's entry: turn ids (`stable_id`) hold no space; the conversation key is the rest."""
    return f"{turn_id} {conversation}"


def parse_member(entry: str) -> tuple[str, str]:
    turn_id, _, conversation = entry.partition(" ")
    return turn_id, conversation


def notice_due_ms(deadline_ms: float, lead_seconds: float) -> float:
    return deadline_ms - lead_seconds * 1000


def notice_kind(bot: BotConfig) -> NoticeKind:
    """With active messages the late answer still comes, as a message of its own."""
    return NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE if bot.active_messages else NoticeKind.REPLY_WINDOW_CLOSING


Verdict = Literal["notice", "ended", "too_late"]


def verdict(*, running: bool, now: float, deadline_ms: float) -> Verdict:
    """What a due entry gets: the notice while its turn runs and a reply can still go; nothing once
    the turn ended (its answer came in time) or the deadline passed (nothing would reach the chat)."""
    if not running:
        return "ended"
    return "notice" if now < deadline_ms else "too_late"


@dataclass
class ReplyDeadlines:
    settings: Settings
    state: State
    outputs: Outputs
    notifier: Notifier
    platforms: Mapping[str, Platform]

    @property
    def watching(self) -> bool:
        """Whether any bot can have turns to watch (a platform with reply windows, a notice lead)."""
        return any(self._watched(bot) for bot in self.settings.bots)

    def _watched(self, bot: BotConfig) -> bool:
        platform = self.platforms.get(bot.platform)
        return platform is not None and platform.profile.reply_window and bot.reply_window_notice_seconds > 0

    def deadline_ms(self, bot: BotConfig, chat_id: str, route: Mapping[str, str]) -> float | None:
        """The turn's reply deadline, when its bot is watched and its platform sets one."""
        if not self._watched(bot):
            return None
        return self.platforms[bot.platform].reply_deadline_ms(bot, chat_id, route)

    # -- dispatch and render -------------------------------------------------------------------
    async def turn_started(
        self, bot: BotConfig, conversation: str, turn_id: str, chat_id: str, route: Mapping[str, str]
    ) -> None:
        """Schedule the notice of a turn that starts (before its send: a crash after the send
        replays as a resume that does not come here). Scheduling it again is harmless."""
        deadline = self.deadline_ms(bot, chat_id, route)
        if deadline is None or now_ms() >= deadline:
            return  # no window, or it closed before the turn started: no notice could get through
        await self.state.deadlines.schedule(
            member(turn_id, conversation), notice_due_ms(deadline, bot.reply_window_notice_seconds)
        )

    async def turn_ended(self, bot: BotConfig, conversation: str, turn_id: str, turn: TurnRecord) -> None:
        """Unschedule a turn that ended (its answer is on its way). One that ends another way (a
        failed send, a dead session) is dropped when it comes due: it no longer runs."""
        if self.deadline_ms(bot, turn.chat_id, turn.route) is not None:
            await self.state.deadlines.remove(member(turn_id, conversation))

    # -- the check -------------------------------------------------------------------------------
    async def run(self, interval: float = CHECK_INTERVAL_S) -> None:
        """Check every `interval` seconds until cancelled; a failed check (Redis away) is retried
        at the next one."""
        while True:
            try:
                await self.check()
            except Exception as exc:  # Redis or the broker away: the claims run out, the next check retries
                log.warning("reply deadlines: check failed (%s); retrying", type(exc).__name__)
            await asyncio.sleep(interval)

    async def check(self, at_ms: float | None = None) -> int:
        """Handle the entries due now (or by `at_ms`); returns how many notices were produced."""
        produced = 0
        while True:
            now = now_ms() if at_ms is None else at_ms
            entries = await self.state.deadlines.claim_due(now, claim_ms=CLAIM_MS, limit=CLAIM_BATCH)
            for entry in entries:
                if await self._handle(entry, now):
                    produced += 1
            if len(entries) < CLAIM_BATCH:
                return produced

    async def _handle(self, entry: str, now: float) -> bool:
        turn_id, conversation = parse_member(entry)
        conversations = self.state.conversations
        turn = await conversations.turn(turn_id, conversation) if turn_id and conversation else None
        bot = self.settings.bot(turn.platform, turn.bot_id) if turn is not None else None
        deadline = self.deadline_ms(bot, turn.chat_id, turn.route) if turn is not None and bot is not None else None
        if turn is None or bot is None or deadline is None:
            await self.state.deadlines.remove(entry)  # nothing left to answer, or no longer watched
            return False
        running = turn_id in await conversations.turns_in_session(conversation)
        outcome = verdict(running=running, now=now, deadline_ms=deadline)
        if outcome == "too_late":
            log.info("reply deadline of a turn in %s passed before its notice could go", conversation)
        if outcome == "notice":
            kind = notice_kind(bot)
            self.outputs.begin()
            await self.outputs.outbound(
                self.notifier.outbound(
                    bot,
                    kind,
                    platform=turn.platform,
                    chat_id=turn.chat_id,
                    chat_type=turn.chat_type,
                    conversation_key=conversation,
                    # One per turn whichever text it has (a bot's active_messages changed meanwhile).
                    outbound_id=stable_id("notice-", conversation, turn_id, "reply_window"),
                    route=turn.route,
                    trace_id=turn.trace_id,
                    hops=dict(turn.hops),
                )
            )
            await self.outputs.delivered()  # in the broker before the entry goes
        await self.state.deadlines.remove(entry)
        return outcome == "notice"
