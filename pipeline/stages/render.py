"""Render: `session.events` → `im.outbound.<platform>` (and tool answers to `session.input`).

A per-conversation turn state machine. The last `agent.message` before `session.status_idle` with
`end_turn` is the final reply: it goes through the segments contract (validation, one correction,
mentions, leak and media checks) and out as one `OutboundMessage`. `requires_action` becomes a
confirmation prompt in the chat, or an answer from a registered IM tool. Errors, exhausted retries
and dead sessions become fixed host notices; a dead session is unmapped. Thinking is never shown.

Replays are harmless: every outbound id and every answer id is derived from server event ids, so
egress and dispatch drop what they already did.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pipeline import metrics
from pipeline.controls.moderation import REDACTED, ModeratedReply, moderate_reply
from pipeline.controls.usage import UsageBudgets
from pipeline.records import (
    ConversationRef,
    OutboundKind,
    OutboundMessage,
    OutboundNote,
    Position,
    SessionCommand,
    SessionEventRecord,
    now_ms,
    parse_conversation_key,
)
from pipeline.segments import finalize as contract
from pipeline.segments.context import Capabilities, Member, ReplyPolicy, TurnContext
from pipeline.segments.leaks import REDACTION_MARKER
from pipeline.segments.media import rejection_label
from pipeline.segments.models import MarkdownData, MarkdownSegment, Segment, TextData, TextSegment
from pipeline.session.models import (
    AgentCustomToolUse,
    AgentMCPToolUse,
    AgentMessage,
    AgentToolUse,
    RequiresAction,
    SessionError,
    SessionStatusIdle,
    SessionStatusTerminated,
    SessionUsage,
)
from pipeline.settings import BotConfig, Settings
from pipeline.state import ConversationState, PendingAction, State, TurnRecord

from ._ids import stable_id
from .deadlines import ReplyDeadlines
from .notify import Notifier
from .outputs import Outputs
from .tools import ImTools, ToolResult

log = logging.getLogger(__name__)

# Starts dispatch's flush of a conversation in this worker (the command, its partition), or leaves
# it to the flush record.
FlushNow = Callable[[SessionCommand, int], Awaitable[None]]

Work = Callable[[], Awaitable[None]]

_TOOL_CALLS = frozenset({"agent.tool_use", "agent.mcp_tool_use", "agent.custom_tool_use"})
_TURN_EVENTS = frozenset({"session.status_idle", "session.status_terminated", "session.deleted"})
# Event types whose handling reads or writes the conversation's state (ordered per conversation).
_STATEFUL = frozenset({"agent.message", "session.usage", *_TOOL_CALLS, *_TURN_EVENTS})


def message_text(event: AgentMessage) -> str:
    """The text of an agent.message: its text blocks joined (the reply contract is one string)."""
    return event.text


# The session protocol's vocabulary for `session.error` (anything else is counted as "other", so a
# server cannot grow the label set).
SESSION_ERROR_TYPES = frozenset(
    {
        "unknown_error",
        "model_overloaded_error",
        "model_rate_limited_error",
        "model_request_failed_error",
        "mcp_connection_failed_error",
        "mcp_authentication_failed_error",
        "billing_error",
        "credential_host_unreachable_error",
    }
)
RETRY_STATUSES = frozenset({"retrying", "exhausted", "terminal"})


def session_error_labels(event: SessionError) -> tuple[str, str]:
    """(error_type, retry_status) of a `session.error` event, bounded to the protocol's vocabulary."""
    error_type, retry_type = event.error.type, event.error.retry_status.type
    return (
        error_type if error_type in SESSION_ERROR_TYPES else "other",
        retry_type if retry_type in RETRY_STATUSES else "other",
    )


ToolCall = AgentToolUse | AgentMCPToolUse | AgentCustomToolUse


def pending_from_tool_event(event: ToolCall) -> PendingAction | None:
    """A tool call the chat (or Switchboard) must answer: `ask` permissions and custom tools."""
    if not event.id:
        return None
    kind: Literal["confirmation", "custom_tool"]
    if isinstance(event, AgentCustomToolUse):
        kind = "custom_tool"
    elif event.evaluated_permission == "ask":
        kind = "confirmation"
    else:
        return None
    return PendingAction(
        event_id=event.id,
        kind=kind,
        name=event.name,
        input=event.input,
        session_thread_id=event.session_thread_id,
    )


def budgeted_bot(settings: Settings, conversation: str) -> BotConfig | None:
    """The conversation's bot when it keeps usage budgets (its turns' `session.usage` is accounted),
    else None."""
    try:
        ref = parse_conversation_key(conversation)
    except ValueError:
        return None
    return _budgeted(settings, ref)


def _budgeted(settings: Settings, ref: ConversationRef) -> BotConfig | None:
    bot = settings.bot(ref.platform, ref.bot_id)
    return bot if bot is not None and bot.budgets.enabled else None


class RenderStage:
    def __init__(
        self,
        settings: Settings,
        state: State,
        outputs: Outputs,
        notifier: Notifier,
        policies: dict[tuple[str, str], ReplyPolicy],
        capabilities: dict[str, Capabilities],
        tools: ImTools,
        *,
        corrector: contract.ReplyCorrector | None = None,
        media: Any = None,
        deadlines: ReplyDeadlines | None = None,
        flush_now: FlushNow | None = None,
    ) -> None:
        self.deadlines = deadlines
        # Dispatch's flush of a conversation, started in this worker without waiting for the flush
        # record to travel through `session.input` (see `_flush`); None where dispatch runs elsewhere.
        self.flush_now = flush_now
        self.budgets = UsageBudgets(state.redis, state.keys)
        self.settings = settings
        self.state = state
        self.outputs = outputs
        self.notifier = notifier
        self.policies = policies
        self.capabilities = capabilities
        self.tools = tools
        self.corrector = corrector
        self.media = media

    @staticmethod
    def handle_inline(record: SessionEventRecord) -> bool:
        """Events that touch no state (errors: counted here) need no keyed work. Returns True when
        the record is fully handled."""
        if isinstance(record.event, SessionError):
            error_type, retry_status = session_error_labels(record.event)
            metrics.SESSION_ERRORS.labels(error_type, retry_status).inc()
            return True
        return record.event.type not in _STATEFUL

    async def admit(self, records: list[SessionEventRecord], positions: list[Position]) -> list[Work | None]:
        """The batch step: a conversation's events of this batch are handled together, in order, in
        its turn (an agent.message followed by its idle needs no write of its own); events that touch
        no state are counted here. The work sits on the conversation's first record: later records
        of the partition are acknowledged only after it."""
        works: list[Work | None] = [None] * len(records)
        groups: dict[str, list[int]] = {}
        for index, record in enumerate(records):
            if not self.handle_inline(record):
                groups.setdefault(record.conversation_key, []).append(index)
        for indexes in groups.values():
            group = [(records[i], positions[i].partition) for i in indexes]
            works[indexes[0]] = functools.partial(self._handle_group, group)
        return works

    async def handle(self, record: SessionEventRecord, partition: int = 0) -> None:
        """One record (the batch path with a batch of one)."""
        if not self.handle_inline(record):
            await self._handle_group([(record, partition)])

    async def _handle_group(self, group: list[tuple[SessionEventRecord, int]]) -> None:
        last: tuple[str, str | None] | None = None  # an agent.message not yet written
        usage: SessionEventRecord | None = None  # a session.usage not yet accounted
        for position, (record, partition) in enumerate(group):
            self.outputs.begin()  # turn-end markers wait for what this record produced (see Outputs)
            event = record.event
            if isinstance(event, AgentMessage | SessionUsage):
                if isinstance(event, AgentMessage):
                    last = (message_text(event), event.id)
                else:
                    usage = record  # accounted with its idle: the turn it ends says whose it is
                if position == len(group) - 1:  # its turn's end is not in this batch: keep it
                    if last is not None:
                        await self.state.conversations.update_conversation(
                            record.conversation_key, last_message=last[0], last_message_id=last[1]
                        )
                    if usage is not None:
                        await self._account(usage, None)
                continue
            if last is not None and isinstance(event, ToolCall):
                await self.state.conversations.update_conversation(
                    record.conversation_key, last_message=last[0], last_message_id=last[1]
                )
            if isinstance(event, ToolCall):
                await self._tool_call(record, event)
            else:
                await self._turn_end_event(record, partition, last, usage)
            last = None
            usage = None

    async def _turn_end_event(
        self,
        record: SessionEventRecord,
        partition: int,
        last: tuple[str, str | None] | None,
        usage: SessionEventRecord | None = None,
    ) -> None:
        conversation = record.conversation_key
        idle = isinstance(record.event, SessionStatusIdle)
        # The idle ends the oldest turn sent to the session and not yet ended (bound once, so a
        # replay binds the same turn): its reply goes to that turn's chat message, even when a later
        # turn has replaced "the current turn" in the state meanwhile.
        ends_turn = idle and _stop_reason(record) != "requires_action"
        end = await self.state.conversations.bind_turn_end(conversation, record.event.id, bind=ends_turn)
        if usage is not None:
            # Before the reply goes out, so the next message already sees the budget it spent. A
            # replay (handled before or not) accounts nothing twice: see `UsageBudgets.account`.
            await self._account(usage, end.turn or end.state.turn)
        if record.event.id and end.handled is not None:
            # Handled before. A flush may still be owed (a crash after the end was written): its
            # repeat is harmless.
            if end.handled == "flush" and end.state.turn is not None:
                await self._flush(record, partition, end.state.turn.platform, end.state.turn.bot_id, end.state.turn)
            return
        state = end.state
        if last is not None:
            state = state.model_copy(update={"last_message": last[0], "last_message_id": last[1]})
        if ends_turn:
            if end.turn is not None:
                state = state.model_copy(update={"turn": end.turn})
            elif state.status == "idle":
                # No turn of ours is running: a turn whose send failed (and was answered with a
                # notice) ran after all. Its answer would be a second one; count it and move on.
                metrics.UNATTRIBUTED_TURN_ENDS.inc()
                log.info("render: idle for %s matches no turn in flight; ignored", conversation)
                if record.event.id:
                    await self.state.markers.set_marker("turnend", record.event.id, conversation)
                return
        await self._turn_end(record, state, partition, end.turn_id)

    async def _turn_end(
        self, record: SessionEventRecord, state: ConversationState, partition: int, turn_id: str | None
    ) -> None:
        event = record.event
        conversation = record.conversation_key
        bot = self._bot(conversation, state)
        if bot is None:
            log.warning("render: no bot for %s", conversation)
            return
        if isinstance(event, SessionStatusIdle):
            stop = event.stop_reason.type
            metrics.TURNS_FINISHED.labels(bot.platform, stop).inc()
            if stop == "requires_action":
                await self._requires_action(bot, record, state)
                await self.outputs.delivered()
                await self.state.conversations.finish_turn(
                    conversation,
                    partition,
                    session_id=record.session_id,
                    event_id=record.event.id,
                    turn_id=None,
                    waiting=True,
                )
            elif stop == "end_turn":
                await self._final_reply(bot, record, state)
                await self._turn_over(bot, record, state, partition, turn_id)
            else:  # retries_exhausted, budget_reached, …: the turn ends, the session stays usable
                notice = "retries_exhausted" if stop == "retries_exhausted" else "session_error"
                await self._notice(bot, record, state, notice)
                await self._turn_over(bot, record, state, partition, turn_id)
            return
        # Terminal: say so once, forget the session; the next message starts a new one.
        metrics.TURNS_FINISHED.labels(bot.platform, event.type.rsplit(".", 1)[-1]).inc()
        kind = "session_terminated" if isinstance(event, SessionStatusTerminated) else "session_deleted"
        await self._notice(bot, record, state, kind)
        await self.state.conversations.unmap_session(conversation, record.session_id)
        await self.outputs.delivered()
        if record.event.id:
            await self.state.markers.set_marker("turnend", record.event.id, conversation)

    # -- steps ---------------------------------------------------------------------------------
    async def _tool_call(self, record: SessionEventRecord, event: ToolCall) -> None:
        conversation = record.conversation_key
        state = await self.state.conversations.conversation(conversation)
        updates: dict[str, Any] = {}
        pending = pending_from_tool_event(event)
        if pending is not None:
            tools = dict(state.tools)
            tools[pending.event_id] = pending
            updates["tools"] = tools
        bot = self._bot(conversation, state)
        if state.last_message and bot is not None and bot.progress:
            # The agent.message before a tool call is progress, shown as plain text (S16), after
            # the bot's moderation lists like the reply; a blocked one is left out (the reply follows).
            progress = self._moderated(bot, record, [_text(state.last_message)], "progress")
            if progress:
                await self._emit(bot, record, state, "progress", progress, suffix="progress")
        if state.last_message:
            updates["last_message"] = None
        if updates:
            await self.state.conversations.update_conversation(conversation, **updates)

    async def _requires_action(self, bot: BotConfig, record: SessionEventRecord, state: ConversationState) -> None:
        stop = record.event.stop_reason if isinstance(record.event, SessionStatusIdle) else None
        ids = list(stop.event_ids) if isinstance(stop, RequiresAction) else []
        pending = [state.tools.get(i) or PendingAction(event_id=i, kind="confirmation") for i in ids]
        confirmations = [p for p in pending if p.kind == "confirmation"]
        custom = [p for p in pending if p.kind == "custom_tool"]
        await self.state.conversations.update_conversation(
            record.conversation_key, status="requires_action", pending=confirmations, last_message=None
        )
        if custom:
            await self._answer_custom_tools(bot, record, state, custom)
        if confirmations:
            turn = state.turn
            who = f"@{turn.starter_id}" if turn and turn.starter_id and bot.confirm_policy != "admins" else "admins"
            if bot.confirm_policy == "anyone" or (turn is not None and turn.chat_type == "private"):
                who = "anyone" if bot.confirm_policy == "anyone" else who
            names = ", ".join(sorted({p.name or "?" for p in confirmations}))
            # Whoever answers must see what they allow: every pending call's input is quoted (one
            # /allow answers them all), each checked whole before it is shortened: a secret cut in
            # two by the limit would otherwise leave a part no check can recognise. (Egress checks
            # the whole prompt again, like every outbound text.)
            scanner = self.policies[(bot.platform, bot.bot_id)].leak_scanner
            quoted: list[str] = []
            for call in confirmations[:_TOOL_INPUTS_QUOTED]:
                scanned = scanner.scan(json.dumps(call.input, ensure_ascii=False))
                if scanned.hits:
                    metrics.LEAK_HITS.labels(bot.platform, "confirmation").inc(scanned.hits)
                quotable = self._moderated_quote(bot, record, scanned.text)
                short = _shortened(quotable, _TOOL_INPUT_CHARS)
                quoted.append(short if short == quotable else short + "…")
            if len(confirmations) > _TOOL_INPUTS_QUOTED:
                quoted.append(f"(+{len(confirmations) - _TOOL_INPUTS_QUOTED})")
            tool_input = "; ".join(quoted)
            await self._notice(
                bot,
                record,
                state,
                "tool_confirmation_prompt",
                kind="confirmation",
                params={"tool_name": names, "who": who, "tool_input": tool_input},
            )

    async def _answer_custom_tools(
        self, bot: BotConfig, record: SessionEventRecord, state: ConversationState, calls: list[PendingAction]
    ) -> None:
        turn = state.turn
        events = []
        for call in calls:
            result = await self.tools.run(bot, record.conversation_key, turn, call)
            metrics.CUSTOM_TOOLS.labels(
                call.name if self.tools.known(call.name) else "unregistered", "error" if result.is_error else "ok"
            ).inc()
            if result.outbound is not None:
                # What the agent asks to send now passes the bot's moderation lists as its reply
                # would; blocked, the agent is told so and nothing is sent.
                outbound = self._moderated(bot, record, result.outbound, "im_tool")
                if outbound:
                    await self.outputs.outbound(
                        self._outbound(bot, record, state, "progress", outbound, suffix=f"tool:{call.event_id}")
                    )
                else:
                    result = ToolResult(_IM_TOOL_BLOCKED, is_error=True)
            event: dict[str, Any] = {
                "type": "user.custom_tool_result",
                "custom_tool_use_id": call.event_id,
                "content": [{"type": "text", "text": result.text}],
            }
            if result.is_error:
                event["is_error"] = True
            if call.session_thread_id:
                event["session_thread_id"] = call.session_thread_id
            events.append(event)
        if turn is None:
            return
        await self.outputs.session_command(
            SessionCommand(
                kind="tool_result",
                conversation_key=record.conversation_key,
                platform=turn.platform,
                bot_id=turn.bot_id,
                chat_id=turn.chat_id,
                chat_type=turn.chat_type,
                session_id=record.session_id,
                events=events,
                route=turn.route,
                trace_id=turn.trace_id,
                hops=turn.hops,
            )
        )

    async def _final_reply(self, bot: BotConfig, record: SessionEventRecord, state: ConversationState) -> None:
        metrics.observe_hop("render", record.hops, "stream", now_ms())
        if state.interrupted == "stop":
            await self._notice(bot, record, state, "stopped")
            return
        if state.interrupted == "failed":  # dispatch ended a turn it could not continue; the chat was told
            return
        turn = state.turn
        ctx = TurnContext(
            bot_id=bot.bot_id,
            platform=bot.platform,
            chat_type=turn.chat_type if turn else "private",
            sender_id=turn.starter_id or "" if turn else "",
            chat_id=turn.chat_id if turn else "",
            context_members=tuple(Member(user_id=i) for i in (turn.known_ids if turn else [])),
            bot_self_ids=frozenset({bot.self_id} if bot.self_id else ()),
        )
        policy = self.policies[(bot.platform, bot.bot_id)]
        outcome = await contract.finalize_reply(
            state.last_message or "",
            ctx,
            policy,
            corrector=self.corrector,
            media=self.media,
            capabilities=self.capabilities.get(bot.platform, Capabilities()),
        )
        platform = bot.platform
        metrics.SEGMENTS.labels(platform, _segments_outcome(outcome)).inc()
        if outcome.leak_hits:
            metrics.LEAK_HITS.labels(platform, "reply").inc(outcome.leak_hits)
        media_rejected: list[str] = []
        for media in outcome.media:
            if not media.accepted:
                reason = rejection_label(media.reason)
                media_rejected.append(reason)
                metrics.MEDIA_REJECTED.labels(platform, reason).inc()
                log.info(
                    "reply of %s: %s media (%s) unavailable: %s",
                    record.conversation_key,
                    media.segment_type,
                    media.kind,
                    reason,
                )
        if outcome.unknown_mentions:
            metrics.UNKNOWN_MENTIONS.labels(platform).inc(outcome.unknown_mentions)
        if outcome.reason not in (contract.OutcomeReason.OK, contract.OutcomeReason.NO_REPLY):
            log.info("reply of %s: %s %s", record.conversation_key, outcome.reason.value, outcome.detail)
        if outcome.notice is not None:
            metrics.NOTICES.labels(platform, outcome.notice.kind.value).inc()
            await self._emit(bot, record, state, "notice", [_text(outcome.notice.text)], suffix="reply")
        else:
            notes: list[OutboundNote] = ["corrected"] if outcome.corrected else []
            # The bot's moderation lists, on the reply as validated and leak-checked.
            if outcome.passthrough is not None:
                reply = self._moderated(bot, record, [_text(outcome.passthrough)])
                if reply:
                    await self._emit(bot, record, state, "reply", reply, suffix="reply", notes=notes)
                else:
                    await self._notice(bot, record, state, "reply_moderated")
            elif outcome.segments:
                reply = self._moderated(bot, record, list(outcome.segments))
                if not reply:
                    await self._notice(bot, record, state, "reply_moderated")
                    return
                await self._emit(
                    bot,
                    record,
                    state,
                    "reply",
                    reply,
                    suffix="reply",
                    notes=notes,
                    media_rejected=media_rejected,
                )

    @staticmethod
    def _moderated(
        bot: BotConfig, record: SessionEventRecord, segments: list[Segment], what: str = "reply"
    ) -> list[Segment]:
        """Agent-written segments after the bot's moderation lists (their text and markdown): as
        they were, redacted, or [] when blocked. `what`: reply, progress or im_tool (logged)."""
        places = [i for i, s in enumerate(segments) if isinstance(s, TextSegment | MarkdownSegment)]
        texts = [_segment_text(segments[i]) for i in places]
        moderated = moderate_reply(bot.moderation, texts)
        if not moderated.hits:
            return segments
        _count_outbound(bot, record, moderated, what)
        if moderated.blocked:
            return []
        out = list(segments)
        for i, text in zip(places, moderated.texts, strict=True):
            segment = out[i]
            out[i] = (
                MarkdownSegment(type="markdown", data=MarkdownData(content=text))
                if isinstance(segment, MarkdownSegment)
                else _text(text)
            )
        return out

    @staticmethod
    def _moderated_quote(bot: BotConfig, record: SessionEventRecord, text: str) -> str:
        """A tool's input as a confirmation prompt quotes it, after the bot's moderation lists:
        redacted, or all of it one `***` when the bot blocks (the prompt still asks, in the bot's
        language, without the words)."""
        moderated = moderate_reply(bot.moderation, [text])
        if not moderated.hits:
            return text
        _count_outbound(bot, record, moderated, "tool input")
        return REDACTED if moderated.blocked else moderated.texts[0]

    async def _turn_over(
        self, bot: BotConfig, record: SessionEventRecord, state: ConversationState, partition: int, turn_id: str | None
    ) -> None:
        """The turn is over: once its output is in the broker, write its end (one round trip) and
        let dispatch send what it held meanwhile. A crash before the end is written replays this
        idle (egress drops the repeated reply by its id); after it, the marker says whether the
        flush is still owed."""
        await self.outputs.delivered()
        held = await self.state.conversations.finish_turn(
            record.conversation_key,
            partition,
            session_id=record.session_id,
            event_id=record.event.id,
            turn_id=turn_id,
            last_message=None,
            last_message_id=None,
            pending=[],
            tools={},
            interrupted=None,
        )
        if self.deadlines is not None and turn_id is not None and state.turn is not None:
            await self.deadlines.turn_ended(bot, record.conversation_key, turn_id, state.turn)
        if held > 0:
            await self._flush(record, partition, bot.platform, bot.bot_id, state.turn)

    async def _flush(self, record: SessionEventRecord, partition: int, platform: str, bot_id: str, turn: Any) -> None:
        """Ask dispatch to send the messages held while the turn ran: a flush record on
        `session.input` (durable: a crash replays it), and, where dispatch runs in this worker and
        owns the conversation's partition, the same flush started at once in the conversation's
        order. The next turn then waits for one broker hop fewer, as a queued message in a busy
        chat would otherwise pay at every turn; the record, when it arrives, finds the session busy
        or nothing held, as a late flush does."""
        chat_id, chat_type = _chat_of(record.conversation_key, turn)
        flush = SessionCommand(
            kind="flush",
            conversation_key=record.conversation_key,
            platform=platform,
            bot_id=bot_id,
            chat_id=chat_id,
            chat_type=chat_type,
            session_id=record.session_id,
            trace_id=stable_id("flush-", record.event.id or record.conversation_key),
        )
        await self.outputs.session_command(flush)
        await self.outputs.delivered()
        if self.flush_now is not None:
            await self.flush_now(flush, partition)

    # -- output helpers ------------------------------------------------------------------------
    async def _notice(
        self,
        bot: BotConfig,
        record: SessionEventRecord,
        state: ConversationState,
        notice: str,
        *,
        kind: OutboundKind = "notice",
        params: dict[str, str] | None = None,
    ) -> None:
        metrics.NOTICES.labels(bot.platform, notice).inc()
        text = self.notifier.text(bot, notice, **(params or {}))
        await self._emit(bot, record, state, kind, [_text(text)], suffix=notice)

    async def _emit(
        self,
        bot: BotConfig,
        record: SessionEventRecord,
        state: ConversationState,
        kind: OutboundKind,
        segments: list[Segment],
        *,
        suffix: str,
        notes: list[OutboundNote] | None = None,
        media_rejected: list[str] | None = None,
    ) -> None:
        outbound = self._outbound(bot, record, state, kind, segments, suffix=suffix, notes=notes)
        if media_rejected:
            outbound = outbound.model_copy(update={"media_rejected": media_rejected})
        await self.outputs.outbound(outbound)

    def _outbound(
        self,
        bot: BotConfig,
        record: SessionEventRecord,
        state: ConversationState,
        kind: OutboundKind,
        segments: list[Segment],
        *,
        suffix: str,
        notes: list[OutboundNote] | None = None,
    ) -> OutboundMessage:
        turn = state.turn
        hops = dict(turn.hops) if turn else {}
        hops.update(record.hops)
        hops["render"] = now_ms()
        chat_id, chat_type = _chat_of(record.conversation_key, turn)
        return OutboundMessage(
            outbound_id=stable_id("out-", record.conversation_key, record.event.id or record.session_id, suffix),
            kind=kind,
            platform=bot.platform,
            bot_id=bot.bot_id,
            chat_id=chat_id,
            chat_type=chat_type,
            conversation_key=record.conversation_key,
            segments=segments,
            # A reply quotes the message it answers; so does "Stopped." (the message whose turn it
            # stopped), as the other answers to a chat command do.
            reply_to_message_id=turn.reply_to_message_id if turn and (kind == "reply" or suffix == "stopped") else None,
            route=turn.route if turn else {},
            trace_id=turn.trace_id if turn else record.trace_id,
            hops=hops,
            notes=notes or [],
        )

    async def _account(self, record: SessionEventRecord, turn: TurnRecord | None) -> None:
        """A turn's `session.usage` into the usage budgets of its bot, chat and starter. Without the
        turn (its idle comes in a later batch) the conversation's current turn is taken. A bot
        without `[bots.budgets]` is not accounted (no Redis call per turn; docs/controls.md)."""
        if not isinstance(record.event, SessionUsage):
            return
        try:
            ref = parse_conversation_key(record.conversation_key)
        except ValueError:
            return
        bot = _budgeted(self.settings, ref)
        if bot is None:
            return
        if turn is None:
            turn = (await self.state.conversations.conversation(record.conversation_key)).turn
        chat_id = turn.chat_id if turn is not None else ref.chat_id
        starter = turn.starter_id if turn is not None else ref.user_id
        await self.budgets.account(bot, record.session_id, record.event.usage, chat_id, starter)

    def _bot(self, conversation: str, state: ConversationState) -> BotConfig | None:
        if state.turn is not None:
            return self.settings.bot(state.turn.platform, state.turn.bot_id)
        try:
            ref = parse_conversation_key(conversation)
        except ValueError:
            return None
        return self.settings.bot(ref.platform, ref.bot_id)


_IM_TOOL_BLOCKED = "Not sent: the message was withheld by the chat's content rules."
_TOOL_INPUT_CHARS = 200  # of the tool input quoted in a confirmation prompt
_TOOL_INPUTS_QUOTED = 3  # calls whose input a confirmation prompt quotes (the rest are counted)


def _count_outbound(bot: BotConfig, record: SessionEventRecord, moderated: ModeratedReply, what: str) -> None:
    """An outbound moderation decision with hits: counted, and logged without the text."""
    outcome = "blocked" if moderated.blocked else "redacted"
    metrics.MODERATION.labels(bot.platform, bot.bot_id, "outbound", outcome, "list").inc()
    log.info("%s of %s: %d moderation hit(s), %s", what, record.conversation_key, moderated.hits, outcome)


def _shortened(text: str, limit: int) -> str:
    """`text` cut at `limit` characters, but never inside a redaction marker (it is kept whole)."""
    if len(text) <= limit:
        return text
    at = text.find(REDACTION_MARKER, max(0, limit - len(REDACTION_MARKER) + 1), limit + len(REDACTION_MARKER))
    return text[: at + len(REDACTION_MARKER)] if 0 <= at < limit else text[:limit]


def _segment_text(segment: Segment) -> str:
    return segment.data.content if isinstance(segment, MarkdownSegment) else segment.data.text  # type: ignore[union-attr]


def _text(text: str) -> TextSegment:
    return TextSegment(type="text", data=TextData(text=text))


def _chat_of(conversation: str, turn: Any) -> tuple[str, Any]:
    if turn is not None:
        return turn.chat_id, turn.chat_type
    # platform:bot:chat[:user] — without turn state (Redis lost) the chat id is still in the key.
    try:
        ref = parse_conversation_key(conversation)
    except ValueError:
        return "", "private"
    return ref.chat_id, "group" if ref.user_id is not None else "private"


def _segments_outcome(outcome: contract.ReplyOutcome) -> str:
    reason = outcome.reason
    if reason is contract.OutcomeReason.NO_REPLY:
        return "empty"
    if reason is contract.OutcomeReason.CORRECTED:
        return "corrected"
    if outcome.notice is not None:
        return "failed"
    return "valid"


def _stop_reason(record: SessionEventRecord) -> str:
    event = record.event
    return event.stop_reason.type if isinstance(event, SessionStatusIdle) else ""
