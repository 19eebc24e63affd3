"""Ingest: `im.inbound` → `session.input` (and notices to `im.outbound.<platform>`).

Drops duplicates, decides whether a message triggers the agent, keeps the group-context window,
handles chat commands, and emits a user turn. Session creation is left to dispatch: it is a slow
HTTP call, and ingest must keep up with every group message (5,500/s per worker target).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import httpx

from pipeline import metrics
from pipeline.addressing import ChatCommand, TriggerReason, parse_chat_command, strip_trigger, trigger_reason
from pipeline.controls.limits import LimitDecision, LimitsConfig, TurnRequest
from pipeline.controls.moderation import ask_hook
from pipeline.controls.usage import Refusal, UsageBudgets
from pipeline.records import CommandKind, InboundMessage, OutboundMessage, Position, SessionCommand, now_ms
from pipeline.segments.models import (
    AudioSegment,
    FileSegment,
    ImageSegment,
    MentionSegment,
    TextSegment,
    VideoSegment,
)
from pipeline.settings import BotConfig, Settings
from pipeline.state import AdmissionResult, ContextEntry, InboundAdmission, State, TurnRecord, context_entry_json
from pipeline.state.limits import TurnLimiter, context_quota

from ._admissions import CoalescedAdmissions
from ._ids import inbound_dedup_id, stable_id, user_message_id
from ._turns import merge_turns
from .inbound_media import fetches_media, media_marker
from .notify import Notifier
from .outputs import Outputs
from .refused_early import EarlyRefusals
from .work import Remaining, SharedWork, run_remaining

log = logging.getLogger(__name__)


MEDIA_SEGMENTS = (ImageSegment, AudioSegment, VideoSegment, FileSegment)


def member_names(message: InboundMessage, window: list[ContextEntry]) -> dict[str, str]:
    """Display names by user id of the people a turn involves: as they last spoke in the window
    (OneBot's `at` carries no name), overridden by what the platform sent with this message."""
    names = {entry.user_id: entry.name for entry in window if entry.name}
    if message.sender.name:
        names[message.sender.user_id] = message.sender.name
    names.update((ident, name) for ident, name in message.mention_names.items() if name)
    return names


def content_blocks(
    message: InboundMessage, bot: BotConfig, *, label_sender: bool, names: dict[str, str] | None = None
) -> list[dict[str, object]]:
    """Session content blocks (text, image) from the message's neutral segments. A mention reads
    `@name` when the name is known (the turn context lists the id to mention back), else `@id`."""
    head = f"[{message.sender.name or message.sender.user_id} ({message.sender.user_id})] " if label_sender else ""
    names = names if names is not None else member_names(message, [])
    blocks: list[dict[str, object]] = []
    texts: list[str] = []
    after_mention = False
    for segment in message.segments:
        if isinstance(segment, TextSegment):
            piece = segment.data.text
            # A mention is a word of its own: `@alice` then `hey` reads `@alice hey`, not `@alicehey`
            # (`@alice, hey` stays as it is).
            if after_mention and _is_word_char(piece[:1]):
                texts.append(" ")
            texts.append(piece)
            after_mention = False
        elif isinstance(segment, MentionSegment):
            target = segment.data.target
            if target != bot.self_id:
                name = names.get(target)
                if texts and _is_word_char(texts[-1][-1:]):
                    texts.append(" ")
                # A Telegram `@username` target is written as it is: Telegram links it.
                texts.append(f"@{name}" if name else target if target.startswith("@") else f"@{target}")
                after_mention = True
        elif isinstance(segment, ImageSegment) and segment.data.media.kind == "url":
            blocks.append({"type": "image", "source": {"type": "url", "url": segment.data.media.value}})
        elif (
            isinstance(segment, MEDIA_SEGMENTS)
            and segment.data.media.kind == "file"
            and fetches_media(message.platform)
        ):
            # The platform's own media (a WhatsApp media id): read by dispatch when the turn is sent.
            blocks.append(media_marker(segment.type, segment.data.media))
    text = "".join(texts).strip() if texts else message.text
    text = strip_trigger(text, bot)
    blocks.insert(0, {"type": "text", "text": head + text})
    return blocks


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


PromptBuilder = Callable[[BotConfig, InboundMessage, list[ContextEntry]], str | None]


@dataclass(slots=True)
class _Plan:
    """What ingest decided for one message before its Redis round trip."""

    message: InboundMessage
    bot: BotConfig | None
    command: ChatCommand | None
    reason: TriggerReason | None
    dedup_id: str
    # A trigger the controls stopped (docs/controls.md): why, for the metric (`moderated`,
    # `rate_limited`), and the notice it is answered with, if any.
    blocked: str | None = None
    notice: str | None = None
    # The controls' decision, counted (and logged) once admission has found the message new: a
    # replayed copy is a duplicate there, and its decision was counted the first time.
    decided: Callable[[], None] | None = None

    def count_decision(self) -> None:
        if self.decided is not None:
            self.decided()
            self.decided = None

    @property
    def settles(self) -> bool:
        """Produces nothing: marked seen at admission."""
        return self.command is None and (self.reason is None or (self.blocked is not None and self.notice is None))


class _Settled:
    """Messages that produce nothing (duplicates, chatter kept in the window), counted per platform
    and added to the counters once per batch: each increment takes a lock, which per message was a
    tenth of ingest's own CPU for chatter."""

    def __init__(self) -> None:
        self.deduplicated: dict[str, int] = {}
        self.filtered: dict[str, int] = {}

    def duplicate(self, message: InboundMessage) -> None:
        self.deduplicated[message.platform] = self.deduplicated.get(message.platform, 0) + 1

    def add(self, plan: _Plan, result: AdmissionResult, now: float) -> None:
        message = plan.message
        if result.duplicate:
            self.duplicate(message)
            return
        plan.count_decision()
        if result.unkept:
            count_unkept(message)
        message.hops["ingest"] = now
        metrics.observe_hop("ingest", message.hops, "ingress", now)
        self.filtered[message.platform] = self.filtered.get(message.platform, 0) + 1

    def count(self) -> None:
        for platform, n in self.deduplicated.items():
            metrics.child(metrics.INBOUND_DEDUPLICATED, platform).inc(n)
        for platform, n in self.filtered.items():
            metrics.child(metrics.INBOUND_FILTERED, platform).inc(n)


def count_unkept(message: InboundMessage) -> None:
    """A group message over its chat's (or its sender's) message limit, not kept as context."""
    metrics.child(metrics.RATE_LIMITED, message.platform, message.bot_id, "context", "unkept").inc()


def _context_entry(message: InboundMessage) -> bytes:
    return context_entry_json(
        message.message_id,
        message.sender.user_id,
        message.sender.name,
        message.text[:500],
        message.sent_at_ms or message.hops.get("ingress", 0.0),
    )


class IngestStage:
    def __init__(
        self,
        settings: Settings,
        state: State,
        outputs: Outputs,
        notifier: Notifier,
        prompt: PromptBuilder,
        *,
        refusals: EarlyRefusals | None = None,
    ) -> None:
        self.settings = settings
        self.state = state
        self.outputs = outputs
        self.notifier = notifier
        self.prompt = prompt
        self.budgets = UsageBudgets(state.redis, state.keys)
        self.admissions = CoalescedAdmissions(
            state.markers, settings.group_context_size, linger=settings.ingest_admission_linger_ms / 1000
        )
        self.limiter = TurnLimiter(state.redis, state.keys)
        # What this worker found over a limit, for its edge to drop before it is a record.
        self.refusals = refusals if refusals is not None else EarlyRefusals()
        self._hook_client: httpx.AsyncClient | None = None

    async def handle(self, message: InboundMessage) -> None:
        """One message (the batch path with a batch of one)."""
        (work,) = await self.admit([message])
        await run_remaining(work)

    async def admit(self, messages: list[InboundMessage], positions: Sequence[Position] = ()) -> list[Remaining]:
        """Admit a batch of messages in offset order, with one Redis round trip for all of them:
        drop duplicates, keep the group-context window, and settle every message that produces
        nothing (most group messages). Returns, per message, the work that remains (a user turn or
        a chat command, which produce records) or None when the message is settled. A batch of
        messages that all produce nothing is not waited for (see `CoalescedAdmissions`): a small
        one waits to share the next batch's round trip, and each of its messages has a work that
        ends once it is admitted; a large one is started at once, and its messages share one work
        that ends once they are admitted."""
        now = now_ms()
        plans: list[_Plan | None] = []
        items: list[InboundAdmission] = []
        seen: set[str] = set()
        size = self.settings.group_context_size
        # The triggers the limits may stop.
        limited: list[_Plan] = []
        clock = int(time.time() * 1000)  # the limits' windows
        for message in messages:
            bot = self.settings.bot(message.platform, message.bot_id)
            if bot is None:
                plans.append(_Plan(message, None, None, None, "unknown_bot"))
                continue
            dedup_id = inbound_dedup_id(message.platform, message.bot_id, message.chat_id, message.message_id)
            if dedup_id in seen:  # twice in one batch: the second is a duplicate
                plans.append(None)
                continue
            seen.add(dedup_id)
            command = parse_chat_command(message.text)
            reason = trigger_reason(message, bot) if command is None else None
            planned = _Plan(message, bot, command, reason, dedup_id)
            if command is None and bot.moderation.lists and bot.moderation.matches(message.text):
                # Commands are never moderated away; chatter that matches is kept out of the window.
                planned.blocked = "moderated"
                if reason is not None:
                    self._count_moderated(planned, "list")
            elif reason is not None and bot.limits.active:
                limited.append(planned)
            plans.append(planned)
        if limited:
            # The limits' Redis step, one script per batch and bot; only batches with triggers of
            # bots with limits pay it.
            decisions = await self.limiter.admit([_turn_request(p) for p in limited], clock)
            for limited_plan, decision in zip(limited, decisions, strict=True):
                self._apply_limit(limited_plan, decision, clock)
        for each in plans:
            if each is None or each.bot is None:
                continue
            message = each.message
            in_window = message.chat_type == "group" and each.command is None
            # Kept out of the window: a moderated message; one over a limit unless the bot holds it.
            if each.blocked == "moderated" or (each.blocked == "rate_limited" and each.bot.limits.over_limit == "drop"):
                in_window = False
            entry_json = _context_entry(message) if in_window else None
            quota = context_quota(each.bot.limits, message.sender.user_id, clock) if in_window else None
            # A message that produces nothing is marked seen at once. A user turn is marked by
            # dispatch when it starts or is held (in the same step); a chat command, or a notice
            # of the controls, once the broker has its output. A copy admitted before that
            # produces again, and dispatch drops the repeated turn by its stable id.
            items.append(
                InboundAdmission(
                    dedup_id=each.dedup_id,
                    conversation=message.conversation_key,
                    entry_json=entry_json,
                    want_window=in_window and each.reason is not None and each.blocked is None and size > 0,
                    mark=each.settles,
                    quota=quota,
                )
            )
        pending: Iterator[asyncio.Future[AdmissionResult]] | None = None
        results: Iterator[AdmissionResult] = iter(())
        settle_all = all(p is None or (p.bot is not None and p.settles) for p in plans)
        if settle_all and self.admissions.startable(items):
            shared = SharedWork(
                functools.partial(self._settle_started, messages, plans, self.admissions.start(items), now)
            )
            return [None if plan is None else shared for plan in plans]
        # Messages that would start a turn, of bots with a usage budget: checked in the same round
        # trip time as the admission (a spent budget starts no turn).
        asks = [
            (i, p)
            for i, p in enumerate(plans)
            if p is not None
            and p.bot is not None
            and p.reason is not None
            and p.blocked is None
            and p.bot.budgets.enabled
        ]
        refusals: dict[int, Refusal] = {}
        if self.admissions.deferrable(items):
            pending = iter(self.admissions.later(items))
        elif items:  # (an empty batch sends nothing, and leaves deferred chatter to its linger)
            if asks:
                admitted_now, checked = await asyncio.gather(
                    self.admissions.now(items),
                    self.budgets.check([(p.bot, p.message) for _, p in asks if p.bot is not None]),
                )
                results = iter(admitted_now)
                refusals = {i: r for (i, _), r in zip(asks, checked, strict=True) if r is not None}
            else:
                results = iter(await self.admissions.now(items))
        admitted = iter(items)
        settled = _Settled()
        works: list[Remaining] = []
        turns: list[tuple[int, _Plan, list[ContextEntry]]] = []  # the batch's user turns
        for index, (message, plan) in enumerate(zip(messages, plans, strict=True)):
            if plan is None:
                settled.duplicate(message)
                works.append(None)
                continue
            if plan.bot is None:
                metrics.INBOUND_DROPPED.labels(message.platform, "unknown_bot").inc()
                works.append(functools.partial(self._unknown_bot, message))
                continue
            item = next(admitted)
            if pending is not None:
                works.append(functools.partial(self._settle_deferred, plan, item, next(pending), now))
                continue
            result = next(results)
            if result.duplicate or plan.settles:
                settled.add(plan, result, now)
                works.append(None)
                continue
            plan.count_decision()
            message.hops["ingest"] = now
            metrics.observe_hop("ingest", message.hops, "ingress", now)
            if result.unkept:
                count_unkept(message)
            if plan.blocked is not None:
                works.append(functools.partial(self._blocked_notice, plan))
                continue
            refusal = refusals.get(index)
            if refusal is not None:
                works.append(functools.partial(self._over_budget, plan, refusal))
                continue
            if plan.command is None:
                turns.append((index, plan, result.window))
            works.append(functools.partial(self._produce, plan, result.window))
        settled.count()
        return self._turns_together(messages, works, turns)

    def _turns_together(
        self,
        messages: list[InboundMessage],
        works: list[Remaining],
        turns: list[tuple[int, _Plan, list[ContextEntry]]],
    ) -> list[Remaining]:
        """A chat's user turns that follow one another in the batch (no other work of the chat in
        between) produce in one work, which waits for the broker once. With a work each, a chat
        sending hundreds of triggering messages a second waited for the broker once per message,
        in its own order: it outran its key, and its backlog filled the executor, which then stopped
        the fetch for every chat. The work sits on the first of them; the others' records are
        acknowledged after it (offset order), so a crash replays them all (dispatch drops repeats
        by their stable ids, and takes out of a merged turn the messages another turn took).

        A bot whose busy policy is `merge` gets them as one user turn per `merge_window_max`
        messages, merged as dispatch merges held turns: a flood then costs the broker, dispatch and
        Redis one record per batch, not one per message (bench/README.md, "Fairness under a flood").
        Other policies keep one turn per message (`queue` answers each)."""
        if len(turns) < 2:
            return works
        turn_at = {index: (plan, window) for index, plan, window in turns}
        runs: dict[str, list[int]] = {}  # per chat, its current run of turns
        groups: list[list[int]] = []
        for index, (message, work) in enumerate(zip(messages, works, strict=True)):
            if work is None or isinstance(work, SharedWork):
                continue
            key = message.conversation_key
            if index in turn_at:
                runs.setdefault(key, []).append(index)
            elif key in runs:  # a command (or a refusal) of the chat ends its run
                groups.append(runs.pop(key))
        groups.extend(runs.values())
        together = list(works)
        for group in groups:
            if len(group) < 2:
                continue
            bot = turn_at[group[0]][0].bot
            merged = self.settings.merge_window_max if bot is not None and bot.busy_policy == "merge" else 1
            together[group[0]] = functools.partial(self._produce_turns, [turn_at[i] for i in group], merged)
            for index in group[1:]:
                together[index] = None
        return together

    async def _settle_started(
        self,
        messages: list[InboundMessage],
        plans: list[_Plan | None],
        started: asyncio.Task[list[AdmissionResult]],
        now: float,
    ) -> None:
        results = iter(await started)
        settled = _Settled()
        for message, plan in zip(messages, plans, strict=True):
            if plan is None:
                settled.duplicate(message)  # twice in the batch
            else:
                settled.add(plan, next(results), now)
        settled.count()

    async def _settle_deferred(
        self, plan: _Plan, item: InboundAdmission, pending: asyncio.Future[AdmissionResult], now: float
    ) -> None:
        if pending.done() and pending.exception() is not None:
            # The call it waited for failed (this is the retry): admitted alone.
            (result,) = await self.admissions.now([item])
        else:
            result = await asyncio.shield(pending)  # a cancelled work leaves the shared call alone
        settled = _Settled()
        settled.add(plan, result, now)
        settled.count()

    def _apply_limit(self, plan: _Plan, decision: LimitDecision, clock: int) -> None:
        if decision.allowed or plan.bot is None:
            return
        message = plan.message
        plan.blocked = "rate_limited"
        plan.notice = "rate_limited" if decision.notice and plan.bot.limits.notice else None
        if decision.again:
            return  # counted and logged when the limits first answered it (maybe in an earlier window)
        if decision.scope is not None:
            self.refusals.note(plan.bot, message, decision.scope, clock)

        def decided() -> None:
            metrics.RATE_LIMITED.labels(message.platform, message.bot_id, decision.scope or "", decision.outcome).inc()
            log.info(
                "ingest: %s message %s over the %s limit (%s)",
                message.conversation_key,
                message.message_id,
                decision.scope,
                decision.outcome,
            )

        plan.decided = decided

    def _count_moderated(self, plan: _Plan, reason: str) -> None:
        assert plan.bot is not None
        message = plan.message
        notice = plan.bot.moderation.inbound == "notice"
        plan.notice = "moderated" if notice else None
        outcome = "noticed" if notice else "dropped"

        def decided() -> None:
            metrics.MODERATION.labels(message.platform, message.bot_id, "inbound", outcome, reason).inc()
            log.info(
                "ingest: %s message %s moderated (%s, %s)",
                message.conversation_key,
                message.message_id,
                reason,
                outcome,
            )

        plan.decided = decided

    async def _blocked_notice(self, plan: _Plan) -> None:
        """A trigger the controls stopped, answered with its notice; marked seen once the broker
        has the notice (a replay before that answers again, under the same stable id)."""
        assert plan.bot is not None and plan.notice is not None
        self.outputs.begin()
        await self.outputs.outbound(self._notice(plan.bot, plan.message, plan.notice))
        await self.outputs.delivered()
        await self.state.markers.set_marker("in", plan.dedup_id, plan.message.conversation_key)

    async def _hook_allows(self, plan: _Plan) -> bool:
        """The bot's moderation hook, asked once per message that would start or join a turn."""
        assert plan.bot is not None
        hook = plan.bot.moderation.hook
        if hook is None:
            return True
        if self._hook_client is None:
            self._hook_client = httpx.AsyncClient()
        message = plan.message
        verdict = await ask_hook(
            self._hook_client,
            hook,
            platform=message.platform,
            bot_id=message.bot_id,
            chat_id=message.chat_id,
            user_id=message.sender.user_id,
            text=message.text,
        )
        if verdict.allowed:
            if verdict.reason == "hook_failed":
                metrics.MODERATION.labels(message.platform, message.bot_id, "inbound", "allowed", "hook_failed").inc()
            return True
        plan.blocked = "moderated"
        self._count_moderated(plan, verdict.reason)
        plan.count_decision()  # asked after admission found the message new
        return False

    async def close(self) -> None:
        if self._hook_client is not None:
            await self._hook_client.aclose()
            self._hook_client = None

    async def _unknown_bot(self, message: InboundMessage) -> None:
        await self.outputs.dead_letter("ingest", "unknown_bot", message.model_dump_json())

    async def _produce(self, plan: _Plan, window: list[ContextEntry]) -> None:
        assert plan.bot is not None
        message = plan.message
        # The record is acknowledged (its offset may be committed) only once the broker has what
        # it produced.
        self.outputs.begin()
        if plan.command is not None:
            await self._command(plan.bot, message, plan.command)
            await self.outputs.delivered()
            await self.state.markers.set_marker("in", plan.dedup_id, plan.message.conversation_key)
            return
        assert plan.reason is not None
        if not await self._hook_allows(plan):
            await self._stopped_by_hook(plan)
            await self.outputs.delivered()
            await self.state.markers.set_marker("in", plan.dedup_id, message.conversation_key)
            return
        metrics.TURNS_TRIGGERED.labels(message.platform, plan.reason).inc()
        await self.outputs.session_command(self.user_turn(plan.bot, message, window))
        # Not waited for in the chat's order: a chat sending hundreds of triggers a second would
        # wait for the broker once per message and fall behind itself (bench/README.md, flood).
        await self.outputs.delivered_outside_key()

    async def _stopped_by_hook(self, plan: _Plan) -> None:
        """A trigger the moderation hook stopped: out of the window again, and its notice, if any
        (the caller marks it seen once the broker has that)."""
        assert plan.bot is not None
        message = plan.message
        if message.chat_type == "group":
            # Admitted into the context window before the hook was asked: taken out again, so
            # the agent never reads it as context (the entry is the same bytes, built again).
            window_key = self.state.keys.window(message.conversation_key)
            await self.state.redis.execute("LREM", window_key, 0, _context_entry(message))
        if plan.notice is not None:
            await self.outputs.outbound(self._notice(plan.bot, message, plan.notice))

    async def _produce_turns(self, turns: list[tuple[_Plan, list[ContextEntry]]], merged: int) -> None:
        """Several user turns of one chat, in order, acknowledged by the broker together; up to
        `merged` messages in one turn (`_turns_together`)."""
        self.outputs.begin()
        bot = turns[0][0].bot
        assert bot is not None
        # The moderation hook, if the bot has one, asked about each message at once.
        verdicts = (
            await asyncio.gather(*(self._hook_allows(plan) for plan, _ in turns))
            if bot.moderation.hook is not None
            else [True] * len(turns)
        )
        allowed: list[tuple[_Plan, list[ContextEntry]]] = []
        stopped: list[_Plan] = []
        for (plan, window), allows in zip(turns, verdicts, strict=True):
            assert plan.reason is not None
            if allows:
                metrics.TURNS_TRIGGERED.labels(plan.message.platform, plan.reason).inc()
                allowed.append((plan, window))
            else:
                await self._stopped_by_hook(plan)
                stopped.append(plan)
        for chunk in _merge_chunks(allowed, merged):
            await self.outputs.session_command(self.merged_turn(bot, [(p.message, w) for p, w in chunk]))
        if stopped:  # their markers, once the broker has their notices (and the turns before them)
            await self.outputs.delivered()
            for plan in stopped:
                await self.state.markers.set_marker("in", plan.dedup_id, plan.message.conversation_key)
            return
        await self.outputs.delivered_outside_key()

    async def _over_budget(self, plan: _Plan, refusal: Refusal) -> None:
        """A usage budget is spent: no turn; the sender hears so once per window (not per message)."""
        assert plan.bot is not None
        message = plan.message
        metrics.child(metrics.BUDGET_REFUSED, message.platform, message.bot_id, refusal.spent.scope).inc()
        self.outputs.begin()
        if await self.budgets.first_notice(refusal):
            log.info(
                "ingest: the %s budget (%s) of %s is spent; a notice to the sender",
                refusal.spent.scope,
                refusal.spent.kind,
                message.conversation_key,
            )
            kind, params = refusal.notice(plan.bot, message)
            await self.outputs.outbound(self._notice(plan.bot, message, kind, **params))
        await self.outputs.delivered()
        await self.state.markers.set_marker("in", plan.dedup_id, message.conversation_key)

    def merged_turn(self, bot: BotConfig, turns: Sequence[tuple[InboundMessage, list[ContextEntry]]]) -> SessionCommand:
        """One user turn for a chat's messages in a row (each with its context window), merged as
        dispatch merges held turns. Only the newest message's system text is kept, so only that
        one is built."""
        if len(turns) == 1:
            return self.user_turn(bot, *turns[0])
        metrics.child(metrics.MESSAGES_MERGED, turns[0][0].platform, "ingest").inc(len(turns))
        *earlier, (newest, window) = turns
        commands = [self.user_turn(bot, message, context, prompt=False) for message, context in earlier]
        return merge_turns([*commands, self.user_turn(bot, newest, window)])

    def user_turn(
        self, bot: BotConfig, message: InboundMessage, window: list[ContextEntry], *, prompt: bool = True
    ) -> SessionCommand:
        inbound_ids = [message.message_id]
        event = {
            "type": "user.message",
            "id": user_message_id(message.conversation_key, inbound_ids),
            "content": content_blocks(
                message, bot, label_sender=message.chat_type == "group", names=member_names(message, window)
            ),
        }
        return SessionCommand(
            kind="user_turn",
            conversation_key=message.conversation_key,
            platform=message.platform,
            bot_id=message.bot_id,
            chat_id=message.chat_id,
            chat_type=message.chat_type,
            events=[event],
            system_text=self.prompt(bot, message, window) if prompt else None,
            inbound_ids=inbound_ids,
            sender=message.sender,
            reply_to_message_id=message.message_id,
            route=message.route,
            trace_id=message.trace_id,
            hops=message.hops,
            known_ids=_known_ids(bot, message, window),
        )

    async def _command(self, bot: BotConfig, message: InboundMessage, command: ChatCommand) -> None:
        metrics.CHAT_COMMANDS.labels(message.platform, command.name).inc()
        conversation = message.conversation_key
        if command.name == "reset":
            await self.state.conversations.unmap_session(conversation)
            await self.outputs.outbound(self._notice(bot, message, "reset"))
            return
        if command.name == "stop":
            await self.outputs.session_command(self._control(message, "interrupt", []))
            return
        if command.name in ("usage", "grant"):
            kind, params = await self.budgets.command(bot, message, command)
            await self.outputs.outbound(self._notice(bot, message, kind, **params))
            return
        # /allow, /deny: answer the pending tool confirmations, if this sender may.
        state = await self.state.conversations.conversation(conversation)
        confirmations = [p for p in state.pending if p.kind == "confirmation"]
        if command.argument and command.name == "allow":
            confirmations = [p for p in confirmations if p.event_id == command.argument] or confirmations
        if not confirmations:
            metrics.INBOUND_DROPPED.labels(message.platform, "nothing_to_confirm").inc()
            return
        if not may_answer(bot, state.turn.starter_id if state.turn else None, message):
            metrics.INBOUND_DROPPED.labels(message.platform, "confirmation_refused").inc()
            refusal = self._notice(bot, message, "confirmation_refused", who=_who_may_answer(bot, state.turn))
            await self.outputs.outbound(refusal.model_copy(update={"notes": ["refused"]}))
            return
        events: list[dict[str, object]] = []
        for pending in confirmations:
            event: dict[str, object] = {
                "type": "user.tool_confirmation",
                "tool_use_id": pending.event_id,
                "result": command.name,
            }
            if command.name == "deny" and command.argument:
                event["deny_message"] = command.argument
            if pending.session_thread_id:
                event["session_thread_id"] = pending.session_thread_id
            events.append(event)
        await self.outputs.session_command(self._control(message, "tool_confirmation", events))

    def _control(self, message: InboundMessage, kind: CommandKind, events: list[dict[str, object]]) -> SessionCommand:
        return SessionCommand(
            kind=kind,
            conversation_key=message.conversation_key,
            platform=message.platform,
            bot_id=message.bot_id,
            chat_id=message.chat_id,
            chat_type=message.chat_type,
            events=events,
            inbound_ids=[message.message_id],
            sender=message.sender,
            reply_to_message_id=message.message_id,
            route=message.route,
            trace_id=message.trace_id,
            hops=message.hops,
        )

    def _notice(self, bot: BotConfig, message: InboundMessage, name: str, **params: str) -> OutboundMessage:
        return self.notifier.answering(
            bot,
            name,
            message,
            outbound_id=stable_id("notice-", message.conversation_key, message.message_id, name),
            reply_to_message_id=message.message_id,
            params=params,
        )


def _merge_chunks(
    turns: list[tuple[_Plan, list[ContextEntry]]], merged: int
) -> Iterator[list[tuple[_Plan, list[ContextEntry]]]]:
    """A run's turns in the chunks that become one turn each: at most `merged` messages, all with
    the same route. A merged turn is answered once, where its newest message was written: a thread
    (Slack, Matrix, Telegram topics) is a route, and a mention in the room beside a mention in one
    of its threads must each be answered where it was asked."""
    chunk: list[tuple[_Plan, list[ContextEntry]]] = []
    for turn in turns:
        if chunk and (len(chunk) >= merged or turn[0].message.route != chunk[0][0].message.route):
            yield chunk
            chunk = []
        chunk.append(turn)
    if chunk:
        yield chunk


def _turn_request(plan: _Plan) -> tuple[str, LimitsConfig, TurnRequest]:
    """What the limiter is asked about a trigger: its bot, the bot's limits, the message. The bot's
    admins (configured, or as the platform reports them) are exempt."""
    message, bot = plan.message, plan.bot
    assert bot is not None
    exempt = message.sender.is_admin or message.sender.user_id in bot.admins
    request = TurnRequest(plan.dedup_id, message.sender.user_id, message.chat_id, exempt=exempt)
    return f"{message.platform}:{message.bot_id}", bot.limits, request


def may_answer(bot: BotConfig, starter_id: str | None, message: InboundMessage) -> bool:
    """Who may answer a tool confirmation: a policy per bot. Admins are the bot's configured
    `admins` and those the platform reports (OneBot's group owner/admin role)."""
    if bot.confirm_policy == "anyone" or message.chat_type == "private":
        return True
    if message.sender.is_admin or message.sender.user_id in bot.admins:
        return True
    return bot.confirm_policy == "starter_and_admins" and starter_id == message.sender.user_id


def _who_may_answer(bot: BotConfig, turn: TurnRecord | None) -> str:
    if bot.confirm_policy == "anyone":
        return "anyone"
    starter = f"@{turn.starter_id}" if turn is not None and turn.starter_id else ""
    if bot.confirm_policy == "admins" or not starter:
        return "admins"
    return f"{starter} / admins"


def _known_ids(bot: BotConfig, message: InboundMessage, window: list[ContextEntry]) -> list[str]:
    """Ids the agent may mention this turn (S5): sender, replied-to author, context, mentions."""
    ids = [message.sender.user_id]
    if message.reply_to is not None and message.reply_to.user_id:
        ids.append(message.reply_to.user_id)
    ids.extend(entry.user_id for entry in window)
    ids.extend(message.mentions)
    seen: set[str] = set()
    unique = []
    for ident in ids:
        if ident and ident != bot.self_id and ident not in seen:
            seen.add(ident)
            unique.append(ident)
    return unique
