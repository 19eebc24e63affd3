"""Dispatch: `session.input` → the session API.

Ordered per conversation (the keyed executor), concurrent across conversations. Applies the busy
policy when a turn is already running, creates sessions, and sends idempotently: user messages
carry stable ids derived from inbound ids; a marker in Redis records a completed send, and a send
that may or may not have happened (a crash mid-call) is looked up in the session's history.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from pipeline import metrics
from pipeline.controls.overload import too_late, waited_seconds
from pipeline.executor import work_revoked
from pipeline.records import Position, SessionCommand, now_ms
from pipeline.session import Provisioner, SessionClient
from pipeline.session.exceptions import NotFoundError, RateLimitedError, SessionAPIError
from pipeline.settings import BotConfig, Settings
from pipeline.state import ConversationState, InflightStream, State, TurnMode, TurnRecord, TurnStart, note_message

from ._ids import inbound_dedup_id, stable_id
from ._turns import merge_turns, message_parts, without_messages
from .deadlines import ReplyDeadlines
from .inbound_media import without_markers
from .notify import Notifier
from .outputs import Outputs
from .streams import StreamRegistry

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]
# The sent marker of a held message told `overloaded` instead of being sent (`_take_held`).
_TOLD_OVERLOADED = "told:overloaded"
# What became of a user turn dispatch tried to start (`DispatchStage._start_turn`).
TurnOutcome = Literal["sent", "failed", "waiting"]


def turn_message_id(command: SessionCommand) -> str:
    """The stable id of a turn's user.message (derived from its inbound ids by ingest)."""
    return str(command.events[0].get("id")) if command.events else stable_id("turn-", command.trace_id)


class DispatchStage:
    def __init__(
        self,
        settings: Settings,
        state: State,
        client: SessionClient,
        provisioner: Provisioner,
        streams: StreamRegistry,
        outputs: Outputs,
        notifier: Notifier,
        typing: Callable[[BotConfig, str, Mapping[str, str]], Awaitable[None]] | None = None,
        deadlines: ReplyDeadlines | None = None,
        media: Callable[[BotConfig, list[dict[str, Any]]], Awaitable[list[dict[str, Any]]]] | None = None,
    ) -> None:
        self.typing = typing
        # Reads a turn's platform media into its content (`inbound_media`); without it they are left out.
        self.media = media
        self.deadlines = deadlines
        self.settings = settings
        self.state = state
        self.client = client
        self.provisioner = provisioner
        self.streams = streams
        self.outputs = outputs
        self.notifier = notifier

    async def admit(self, commands: list[SessionCommand], positions: list[Position]) -> list[Work | None]:
        """The batch step: each command is sent in its conversation's turn. A chat's user turns
        that follow one another in the batch (nothing else of the chat in between; busy policy
        merge or queue) are one work: the first is handled as usual, the rest decided in one round
        trip (`_user_turns`). One at a time, a chat sending hundreds of triggering messages a
        second outran its own key, and its backlog filled the executor, which then stopped the
        fetch for every chat."""
        works: list[Work | None] = [
            functools.partial(self.handle, c, p.partition) for c, p in zip(commands, positions, strict=True)
        ]
        runs: dict[str, list[int]] = {}
        groups: list[list[int]] = []
        for index, command in enumerate(commands):
            key = command.conversation_key
            bot = self.settings.bot(command.platform, command.bot_id)
            if command.kind == "user_turn" and bot is not None and bot.busy_policy in ("merge", "queue"):
                runs.setdefault(key, []).append(index)
            elif key in runs:
                groups.append(runs.pop(key))
        groups.extend(runs.values())
        for group in groups:
            if len(group) > 1:
                works[group[0]] = functools.partial(
                    self._user_turns, [commands[i] for i in group], positions[group[0]].partition
                )
                for index in group[1:]:
                    works[index] = None  # acknowledged after the group's work (offset order)
        return works

    async def _user_turns(self, commands: list[SessionCommand], partition: int) -> None:
        """A chat's user turns in a row: the first as usual (it may start a turn), then the rest
        decided in one round trip, in order. Most are held behind the running turn; any other
        decision (a start, a session to create, a turn to resume) is then handled as usual, in
        order: a turn the script recorded as started is found so (`resume`) and sent."""
        await self.handle(commands[0], partition)
        rest = commands[1:]
        bot = self.settings.bot(rest[0].platform, rest[0].bot_id)
        assert bot is not None  # checked by `admit`
        calls = []
        for command in rest:
            if "dispatch_in" not in command.hops:
                now = command.hops["dispatch_in"] = now_ms()
                metrics.observe_hop("dispatch", command.hops, "ingest", now)
            calls.append(self._begin_call(command, partition, turn_message_id(command), bot.busy_policy))
        starts = await self.state.conversations.begin_turns(rest[0].conversation_key, partition, calls)
        flush = None
        for command, start in zip(rest, starts, strict=True):
            if start.decision == "done":
                metrics.SESSION_CALLS.labels("user_turn", "replay_skipped").inc()
            elif start.decision in ("held", "behind"):
                metrics.MESSAGES_HELD.labels(command.platform, bot.busy_policy).inc(len(command.inbound_ids) or 1)
                if start.decision == "behind":
                    flush = command
            elif start.decision == "partial":  # the messages no other turn took, as usual
                await self.handle(self._untaken(command, start), partition)
            else:
                await self.handle(command, partition)
        if flush is not None:  # idle with messages held: they go now, oldest first (see `_start_turn`)
            await self._flush(bot, flush, partition)

    async def handle(self, command: SessionCommand, partition: int) -> None:
        bot = self.settings.bot(command.platform, command.bot_id)
        if bot is None:
            await self.outputs.dead_letter(
                "dispatch", "unknown_bot", command.model_dump_json(), key=command.conversation_key
            )
            return
        if "dispatch_in" not in command.hops:
            now = command.hops["dispatch_in"] = now_ms()
            metrics.observe_hop("dispatch", command.hops, "ingest", now)
        try:
            if command.kind == "user_turn":
                await self._user_turn(bot, command, partition)
            elif command.kind == "flush":
                await self._flush(bot, command, partition)
            elif command.kind == "interrupt":
                await self._interrupt(bot, command)
            else:  # tool_confirmation, tool_result
                await self._answer(bot, command, partition)
        except SessionAPIError as exc:
            await self._failed(bot, command, exc)

    async def _failed(
        self, bot: BotConfig, command: SessionCommand, exc: SessionAPIError, *, turn_id: str | None = None
    ) -> bool:
        """A session API call failed for `command`. The client already retried what can be retried:
        tell the chat, keep the record (dead-lettered). False when the partition moved meanwhile
        (nothing told: left to its new owner).

        A user turn (`turn_id`) is marked failed first, with the notice's kind: the chat is told
        instead of answered, so nothing may send it later (a replay of its record after a crash, a
        flush finding it held), which would answer the message twice; a replay tells it again."""
        metrics.SESSION_CALLS.labels(command.kind, type(exc).__name__).inc()
        log.warning("dispatch failed for %s: %s", command.conversation_key, type(exc).__name__)
        if work_revoked():
            # The partition moved meanwhile: its new owner sends this command again (and tells
            # the chat if that fails too). A notice from here would come on top of its reply.
            log.info("dispatch of %s: partition revoked during the call; left to its new owner", command.kind)
            return False
        # The agent API still answered 429 after the client's retries: busy, not broken.
        overloaded = isinstance(exc, RateLimitedError) and command.kind in ("user_turn", "flush")
        kind = "overloaded" if overloaded else "provider_error"
        conversation = command.conversation_key
        if turn_id is not None:
            await self.state.markers.set_marker("sent", turn_id, conversation, value=f"failed:{kind}")
        if not await self.state.conversations.turns_in_session(conversation):
            await self.state.conversations.update_conversation(conversation, status="idle")
        await self.outputs.dead_letter(
            "dispatch", "session_api_error", command.model_dump_json(), error=str(exc), key=conversation
        )
        if overloaded:
            metrics.OVERLOADED.labels(command.platform, command.bot_id).inc()
        await self._notice(bot, command, kind)
        return True

    # -- user turns ----------------------------------------------------------------------------
    async def _user_turn(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        if too_late(bot.overload, command.hops, now_ms()):
            await self._overloaded(bot, [command])
            return
        await self._start_turn(bot, command, partition, mode=bot.busy_policy)

    async def _overloaded(self, bot: BotConfig, commands: list[SessionCommand]) -> None:
        """Messages whose turn did not start within the bot's bound: one notice (answering the
        newest) instead of an answer to a question asked long ago. Its id is stable over the
        messages, so a replay, or a flush that finds them held again, sends it once."""
        last = commands[-1]
        inbound_ids = [i for c in commands for i in c.inbound_ids]
        metrics.OVERLOADED.labels(last.platform, last.bot_id).inc(len(inbound_ids) or len(commands))
        waited = waited_seconds(commands[0].hops, now_ms()) or 0.0
        log.info(
            "dispatch: %d message(s) of %s waited %.0f s for a turn (bound %.0f s): overloaded notice",
            len(inbound_ids) or len(commands),
            last.conversation_key,
            waited,
            bot.overload.max_wait_seconds,
        )
        await self.outputs.outbound(
            self.notifier.answering(
                bot,
                "overloaded",
                last,
                outbound_id=stable_id("notice-", last.conversation_key, "overloaded", *inbound_ids),
                reply_to_message_id=last.reply_to_message_id,
            )
        )

    async def _flush(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        conversation = command.conversation_key
        # Held commands stay in Redis until the turn that carries them is sent, or given up with a
        # notice: a crash in between replays this flush, and the turn's stable id makes the second
        # send a no-op (or tells the chat again). A turn given up leaves the next held one to go.
        while (taken := await self._take_held(bot, conversation)) is not None:
            held, count = taken
            turn = merge_turns(held)
            if len(held) > 1:
                metrics.child(metrics.MESSAGES_MERGED, turn.platform, "dispatch").inc(len(turn.inbound_ids))
            if "held" in turn.hops:
                turn.hops["released"] = now_ms()
            outcome = await self._start_turn(bot, turn, partition, mode="flush")
            if outcome != "waiting":
                await self.state.conversations.drop_held(conversation, count)
            if outcome != "failed":
                return

    async def _take_held(self, bot: BotConfig, conversation: str) -> tuple[list[SessionCommand], int] | None:
        """The held commands the next flushed turn carries, and how many held entries that takes
        (with any found sent before, and any too old, told so here); None when nothing is held."""
        conversations = self.state.conversations
        # merge: up to the merge window's messages in one turn (the rest goes in the next; a held
        # command may carry several, merged by ingest); queue: one.
        limit = self.settings.merge_window_max if bot.busy_policy == "merge" else 1
        while True:
            raw = await conversations.peek_held(conversation, limit)
            if not raw:
                return None
            # A replayed command may have been held although its turn was sent already, and one
            # too old for a turn told so by a flush that then found the session busy: drop them.
            sent = await self.state.markers.markers("sent", [turn_id for turn_id, _ in raw], conversation)
            held: list[tuple[str, SessionCommand]] = []
            taken = messages = 0  # held entries this flush takes; messages among them
            # This flush tells a failed turn again (a crash came between its notice and the drop of
            # its entry): it goes alone, under its own id, so that it is told the same, never sent.
            retelling = False
            for (turn_id, entry), marker in zip(raw, sent, strict=True):
                done = marker == "1" or marker == _TOLD_OVERLOADED
                failed = str(marker).startswith("failed:")
                kept = SessionCommand.model_validate_json(entry) if not done else None
                count = len(kept.inbound_ids) if kept is not None else 0
                if held and (
                    failed or messages + count > limit or (kept is not None and kept.route != held[0][1].route)
                ):
                    # A merged turn is answered in one place, the thread of its newest message:
                    # messages of another thread wait for the next flush.
                    break
                taken += 1
                messages += count
                if kept is not None:
                    held.append((turn_id, kept))
                if failed:
                    retelling = True
                    break
            stale = [(t, c) for t, c in held if not retelling and too_late(bot.overload, c.hops, now_ms())]
            if stale:  # their turn did not start in time: the notice instead (they go with this flush)
                await self._overloaded(bot, [c for _, c in stale])
                # Marked: should the session be busy, they stay in the queue, and a later flush must
                # not tell them again (grouped otherwise, under another notice id).
                told = [t for t, _ in stale]
                await self.state.markers.set_markers("sent", told, conversation, value=_TOLD_OVERLOADED)
                held = [(t, c) for t, c in held if t not in told]
            if held:
                return [c for _, c in held], taken
            await conversations.drop_held(conversation, taken)

    async def _start_turn(
        self, bot: BotConfig, command: SessionCommand, partition: int, *, mode: TurnMode
    ) -> TurnOutcome:
        """Record and send one user turn (one Redis round trip to decide and record it; see
        `ConversationStore.begin_turn`): `sent` (or found sent before), `failed` (the session API
        failed it and the chat was told, now or before), `waiting` (held, busy, or its partition
        moved while it failed)."""
        conversation = command.conversation_key
        turn_id = turn_message_id(command)
        start = await self._begin(command, partition, turn_id, mode)
        while start.decision == "partial":
            # A replayed merged turn, some of whose messages another turn took: the rest only.
            command = self._untaken(command, start)
            turn_id = turn_message_id(command)
            start = await self._begin(command, partition, turn_id, mode)
        if start.decision == "failed" and "replay" in command.hops:
            # An operator's replay of its dead letter: send it after all, as a send cut short.
            start = await self._begin(command, partition, turn_id, "resume")
        if start.decision == "failed":
            # Told before: tell again (the notice's id is stable), in case a crash cut that short.
            metrics.SESSION_CALLS.labels("user_turn", "replay_skipped").inc()
            await self._notice(bot, command, start.failure or "provider_error")
            return "failed"
        try:
            return await self._send_turn(bot, command, partition, turn_id, start, mode)
        except SessionAPIError as exc:
            # Not sent (as far as the client can tell): no idle will end this turn.
            await self.state.conversations.drop_turn(conversation, turn_id)
            return "failed" if await self._failed(bot, command, exc, turn_id=turn_id) else "waiting"

    async def _send_turn(
        self, bot: BotConfig, command: SessionCommand, partition: int, turn_id: str, start: TurnStart, mode: TurnMode
    ) -> TurnOutcome:
        conversation = command.conversation_key
        events = list(command.events)
        if command.system_text:
            events.append({"type": "system.message", "content": [{"type": "text", "text": command.system_text}]})
        if start.decision == "no_session":
            created = await self._create_session(command)
            start = await self._begin(command, partition, turn_id, mode, new_session=created)
        if start.decision == "resume":
            # A send cut short by a crash. Posted: the attempt that posted it had recorded the turn
            # and its stream in flight first, so the stream's owner finishes it (writing "running"
            # again could outlive that turn's end). Not posted: record it again and send it now.
            if start.session_id and await self._in_history(start.session_id, events):
                return "sent"
            start = await self._begin(command, partition, turn_id, "resume")
        if start.decision == "done":
            metrics.SESSION_CALLS.labels("user_turn", "replay_skipped").inc()
            return "sent"
        if start.decision in ("held", "behind"):
            metrics.MESSAGES_HELD.labels(command.platform, bot.busy_policy).inc(len(command.inbound_ids) or 1)
            if start.decision == "behind":
                # Idle, but messages held during the last turn wait for its flush, which may still
                # be on its way: flush now, oldest first (the flush that arrives later finds the
                # session busy and does nothing).
                await self._flush(bot, command, partition)
            return "waiting"
        if start.decision != "start" or start.session_id is None:
            return "waiting"  # busy (a flush while another turn runs: that turn's end flushes again)
        session_id = start.session_id
        # With SWITCHBOARD_REDIS_REPLICA_WAIT_MS: the turn's record on a replica before the message
        # reaches the session. A failover that lost it would leave the session's answer matching no
        # turn (render ignores it) while a replay finds the message sent: the reply would be lost.
        await self.state.redis.replicated()
        if self.deadlines is not None:
            await self.deadlines.turn_started(bot, conversation, turn_id, command.chat_id, command.route)
        await self.streams.track(
            partition,
            InflightStream(session_id, conversation, cursor=start.cursor, trace_id=command.trace_id),
            registered=True,
        )
        events = await self.media(bot, events) if self.media is not None else without_markers(events)
        if start.interrupt:  # busy policy interrupt: stop the running turn; this one runs after it
            await self._send(session_id, [{"type": "user.interrupt"}], call="interrupt")
        try:
            await self._send(session_id, events, call="user_turn")
        except NotFoundError:
            # The session is gone (deleted, expired): start a new one and send there, once.
            log.info("session of %s is gone; creating a new one", conversation)
            await self.streams.untrack(partition, session_id, conversation)
            await self.state.conversations.unmap_session(conversation, session_id)
            created = await self._create_session(command)
            start = await self._begin(command, partition, turn_id, "resume", new_session=created)
            if start.session_id is None:
                raise
            await self.streams.track(
                partition,
                InflightStream(start.session_id, conversation, trace_id=command.trace_id),
                registered=True,
            )
            await self._send(start.session_id, events, call="user_turn")
        metrics.TURNS_STARTED.labels(command.platform, bot.busy_policy).inc()
        if self.typing is not None:
            await self.typing(bot, command.chat_id, command.route)
        return "sent"

    async def _begin(
        self,
        command: SessionCommand,
        partition: int,
        turn_id: str,
        mode: TurnMode,
        *,
        new_session: str | None = None,
    ) -> TurnStart:
        call = self._begin_call(command, partition, turn_id, mode, new_session=new_session)
        return await self.state.conversations.begin_turn(command.conversation_key, partition, **call)

    def _begin_call(
        self, command: SessionCommand, partition: int, turn_id: str, mode: TurnMode, *, new_session: str | None = None
    ) -> dict[str, Any]:
        """The arguments of `ConversationStore.begin_turn` for this command."""
        call: dict[str, Any] = {
            "turn_id": turn_id,
            "mode": mode,
            "turn": self._turn_record(command),
            "trace_id": command.trace_id,
            "inbound_markers": [
                inbound_dedup_id(command.platform, command.bot_id, command.chat_id, i) for i in command.inbound_ids
            ],
            "note": self._console_note(command, mode),
            "new_session": new_session,
            "command_json": None,  # a turn that cannot be held never needs its command kept
            # A merged turn replayed after a crash may carry messages another turn took: it comes
            # back `partial` when it says which content blocks are whose.
            "can_cut": len(command.inbound_ids) > 1
            and mode not in ("flush", "resume")
            and message_parts(command) is not None,
        }
        if mode in ("merge", "queue") and len(command.inbound_ids) > 1 and command.platform == "console":
            # Several messages merged by ingest, starting at once: the console shows them merged.
            call["start_note"] = note_message(command.bot_id, command.chat_id, "merged", command.inbound_ids)
        if mode in ("merge", "queue"):
            # The command goes along in case the session is busy: dumping it costs far less than the
            # second round trip that asking for it after a `hold` would. The time from here to its
            # release is the busy policy's wait, which latency reports keep apart from the pipeline's
            # own overhead.
            held = command.model_copy(update={"hops": {**command.hops, "held": now_ms()}})
            call["command_json"] = held.model_dump_json()
        return call

    def _untaken(self, command: SessionCommand, start: TurnStart) -> SessionCommand:
        """The turn without the messages `begin_turn` found taken (`partial`)."""
        rest = without_messages(command, start.taken)
        if rest is None:  # the script says `partial` only for a turn that can be cut
            raise RuntimeError(f"begin_turn said partial for a turn that cannot be cut: {command.trace_id}")
        log.info(
            "dispatch: %d of the %d messages of a replayed turn of %s were taken by another turn; sending the rest",
            sum(start.taken),
            len(start.taken),
            command.conversation_key,
        )
        metrics.SESSION_CALLS.labels("user_turn", "replay_cut").inc()
        return rest

    def _console_note(self, command: SessionCommand, mode: TurnMode) -> tuple[str, str] | None:
        """The status note the console page shows on the messages of a turn that is held (merge,
        queue) or released by a flush: published by `begin_turn` itself. Other platforms: none."""
        if command.platform != "console" or mode not in ("merge", "queue", "flush"):
            return None
        ids = command.inbound_ids
        note = "held" if mode != "flush" else "merged" if len(ids) > 1 else "released"
        return self.state.console.channel, note_message(command.bot_id, command.chat_id, note, ids)

    @staticmethod
    def _turn_record(command: SessionCommand) -> TurnRecord:
        return TurnRecord(
            trace_id=command.trace_id,
            platform=command.platform,
            bot_id=command.bot_id,
            chat_id=command.chat_id,
            chat_type=command.chat_type,
            starter_id=command.sender.user_id if command.sender else None,
            known_ids=command.known_ids,
            reply_to_message_id=command.reply_to_message_id,
            route=command.route,
            hops={**command.hops, "dispatch": now_ms()},
            inbound_ids=command.inbound_ids,
        )

    async def _create_session(self, command: SessionCommand) -> str:
        """A new session for the conversation; `begin_turn` maps it with the turn's start (when
        another was mapped meanwhile, that one carries the turn and this one stays unused)."""
        session_id = await self.provisioner.create_session()
        metrics.SESSIONS_CREATED.labels(command.platform).inc()
        return session_id

    # -- control -------------------------------------------------------------------------------
    async def _interrupt(self, bot: BotConfig, command: SessionCommand) -> None:
        conversation = command.conversation_key
        conversations = self.state.conversations
        state = await conversations.conversation(conversation)
        if state.held and command.platform == "console":  # the page shows these as dropped
            held = [SessionCommand.model_validate_json(c) for _, c in await conversations.peek_held(conversation)]
            dropped = [i for c in held for i in c.inbound_ids]
            await self.state.console.publish_note(command.bot_id, command.chat_id, "dropped", dropped)
        await conversations.clear_held(conversation)  # /stop also drops what was waiting
        if state.status == "idle" or not state.session_id:
            await self._notice(bot, command, "stopped")  # nothing running: say so, send nothing (Ark errors)
            return
        await conversations.update_conversation(conversation, interrupted="stop")
        await self._send(state.session_id, [{"type": "user.interrupt"}], call="interrupt")

    async def _answer(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        conversation = command.conversation_key
        state = await self.state.conversations.conversation(conversation)
        if not state.session_id:
            return
        answered = {str(e.get("tool_use_id") or e.get("custom_tool_use_id")) for e in command.events}
        remaining = [p for p in state.pending if p.event_id not in answered]
        key = stable_id("answer-", conversation, *sorted(answered))
        stream = InflightStream(state.session_id, conversation, cursor=state.cursor, trace_id=command.trace_id)
        await self.state.conversations.resume_turn(
            conversation,
            partition,
            stream,
            status="running" if not remaining else "requires_action",
            pending=remaining,
        )
        await self.streams.track(partition, stream, registered=True)
        try:
            await self._send_once(conversation, state.session_id, key, command.events, call=command.kind)
        except SessionAPIError:
            if not work_revoked():  # (moved meanwhile: its new owner has the record, and writes this state)
                await self._not_answered(command, state, state.session_id, partition)
            raise

    async def _not_answered(
        self, command: SessionCommand, state: ConversationState, session_id: str, partition: int
    ) -> None:
        """An answer the session API refused. A custom tool's result the turn waited for ends that
        turn; anything else (or when the turn cannot be ended) puts the conversation back as it
        was: waiting on the chat (the session still waits for these answers), so that after the
        notice the chat can answer again (the same answer claims the same send marker, and sends),
        its stream released again. A late answer to a turn running meanwhile keeps that turn's
        stream."""
        conversation = command.conversation_key
        if command.kind == "tool_result" and state.status == "requires_action":
            if await self._end_unanswered_turn(conversation, session_id):
                return
        if state.status != "running":
            await self.streams.untrack(partition, session_id, conversation)
        await self.state.conversations.update_conversation(
            conversation, status=state.status, pending=state.pending, interrupted=state.interrupted
        )

    async def _end_unanswered_turn(self, conversation: str, session_id: str) -> bool:
        """A custom tool's result the session refused: nothing else will answer it (render ran the
        tool; the chat cannot), so the turn is interrupted rather than left waiting for good, and
        the chat may write again once it ends. Render takes that end silently (the chat is told of
        the failure here), so the cause is written before the interrupt can end the turn. False
        when the interrupt is refused too (the session API is down): the conversation then waits
        until the chat's /stop, or an operator's replay of the dead-lettered result."""
        await self.state.conversations.update_conversation(
            conversation, status="running", pending=[], interrupted="failed"
        )
        try:
            await self._send(session_id, [{"type": "user.interrupt"}], call="interrupt")
        except SessionAPIError:
            return False
        return True

    # -- sending -------------------------------------------------------------------------------
    async def _send_once(
        self, conversation: str, session_id: str, marker_id: str, events: list[dict[str, Any]], *, call: str
    ) -> None:
        """Send unless a previous attempt (before a crash) is known or found to have delivered it."""
        previous = await self.state.markers.claim_send(marker_id, conversation)
        if previous == "1":
            return
        await self._send_claimed(conversation, session_id, marker_id, previous, events, call=call)

    async def _send_claimed(
        self,
        conversation: str,
        session_id: str,
        marker_id: str,
        previous: str | None,
        events: list[dict[str, Any]],
        *,
        call: str,
    ) -> None:
        if previous == "sending" and await self._in_history(session_id, events):
            await self.state.markers.set_marker("sent", marker_id, conversation)
            return
        await self._send(session_id, events, call=call)
        await self.state.markers.set_marker("sent", marker_id, conversation)

    async def _in_history(self, session_id: str, events: list[dict[str, Any]]) -> bool:
        wanted = next((e.get("id") for e in events if e.get("type") == "user.message" and e.get("id")), None)
        if wanted is None:
            return False
        scanned = 0
        async for event in self.client.list(session_id, order="desc", limit=100):
            if event.id == wanted:
                return True
            scanned += 1
            if scanned >= 200:
                break
        return False

    async def _send(self, session_id: str, events: list[dict[str, Any]], *, call: str) -> None:
        await self.client.send(session_id, events, echo=False)
        metrics.SESSION_CALLS.labels(call, "ok").inc()

    async def _notice(self, bot: BotConfig, command: SessionCommand, kind: str) -> None:
        await self.outputs.outbound(
            self.notifier.answering(
                bot,
                kind,
                command,
                outbound_id=stable_id("notice-", command.conversation_key, command.trace_id, kind),
                reply_to_message_id=command.reply_to_message_id,
            )
        )
