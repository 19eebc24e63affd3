"""Dispatch: `session.input` → the session API.

Ordered per conversation (the keyed executor), concurrent across conversations. Applies the busy
policy when a turn is already running, creates sessions, and sends idempotently: user messages
carry stable ids derived from inbound ids; a marker in Redis records a completed send, and a send
that may or may not have happened (a crash mid-call) is looked up in the session's history.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pipeline import metrics
from pipeline.records import Position, SessionCommand, now_ms
from pipeline.session import Provisioner, SessionClient
from pipeline.session.exceptions import NotFoundError, SessionAPIError
from pipeline.settings import BotConfig, Settings
from pipeline.state import ConversationState, InflightStream, StateStore, TurnContext

from ._ids import stable_id, user_message_id
from .notices import Notices
from .outputs import Outputs
from .streams import StreamRegistry

log = logging.getLogger(__name__)

Work = Callable[[], Awaitable[None]]


def merge_turns(commands: Sequence[SessionCommand]) -> SessionCommand:
    """Coalesce held user turns into one: content blocks in order, one stable id over all inputs.

    The newest command's system text wins (its context window is the most recent); mentionable
    ids are the union.
    """
    if len(commands) == 1:
        return commands[0]
    inbound_ids = [i for c in commands for i in c.inbound_ids]
    content: list[Any] = []
    for command in commands:
        for event in command.events:
            if event.get("type") == "user.message":
                content.extend(event.get("content", []))
    last = commands[-1]
    known: list[str] = []
    for command in commands:
        known.extend(i for i in command.known_ids if i not in known)
    hops = dict(commands[0].hops)
    return last.model_copy(
        update={
            "events": [
                {"type": "user.message", "id": user_message_id(last.conversation_key, inbound_ids), "content": content}
            ],
            "inbound_ids": inbound_ids,
            "known_ids": known,
            "hops": hops,
        }
    )


def turn_message_id(command: SessionCommand) -> str:
    """The stable id of a turn's user.message (derived from its inbound ids by ingest)."""
    return str(command.events[0].get("id")) if command.events else stable_id("turn-", command.trace_id)


class DispatchStage:
    def __init__(
        self,
        settings: Settings,
        state: StateStore,
        client: SessionClient,
        provisioner: Provisioner,
        streams: StreamRegistry,
        outputs: Outputs,
        notices: Notices,
        typing: Callable[[BotConfig, str], Awaitable[None]] | None = None,
    ) -> None:
        self.typing = typing
        self.settings = settings
        self.state = state
        self.client = client
        self.provisioner = provisioner
        self.streams = streams
        self.outputs = outputs
        self.notices = notices

    async def admit(self, commands: list[SessionCommand], positions: list[Position]) -> list[Work | None]:
        """The batch step: each command is sent in its conversation's turn."""
        return [functools.partial(self.handle, c, p.partition) for c, p in zip(commands, positions, strict=True)]

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
            # The client already retried what can be retried: tell the chat, keep the record.
            metrics.SESSION_CALLS.labels(command.kind, type(exc).__name__).inc()
            log.warning("dispatch failed for %s: %s", command.conversation_key, type(exc).__name__)
            if not await self.state.turns_in_session(command.conversation_key):
                await self.state.update_conversation(command.conversation_key, status="idle")
            await self.outputs.dead_letter(
                "dispatch", "session_api_error", command.model_dump_json(), error=str(exc), key=command.conversation_key
            )
            await self._notice(bot, command, "provider_error")

    # -- user turns ----------------------------------------------------------------------------
    async def _user_turn(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        conversation = command.conversation_key
        state, sent = await self.state.conversation_and_marker(conversation, "sent", turn_message_id(command))
        if sent == "1":
            metrics.SESSION_CALLS.labels("user_turn", "replay_skipped").inc()
            return  # a replay (after a crash) of a turn already sent: its state was written then
        if sent == "sending":
            # A replay of this very turn, interrupted between claiming and confirming the send:
            # the "running" state is its own, not another turn's. Finish starting it.
            await self._start_turn(bot, command, state, partition)
            return
        if state.status != "idle" and state.session_id:
            if bot.busy_policy in ("merge", "queue"):
                # "held" → "released": time spent waiting for the chat's running turn (the busy
                # policy), which latency reports keep apart from the pipeline's own overhead.
                held = command.model_copy(update={"hops": {**command.hops, "held": now_ms()}})
                if await self.state.hold_if_busy(conversation, held.model_dump_json()):
                    metrics.MESSAGES_HELD.labels(command.platform, bot.busy_policy).inc()
                    return
                # The turn ended since we looked: start this one now.
                await self._start_turn(bot, command, await self.state.conversation(conversation), partition)
                return
            # interrupt: stop the running turn; the session runs the new message after it.
            await self._send(state.session_id, [{"type": "user.interrupt"}], call="interrupt")
            await self.state.update_conversation(conversation, interrupted=True)
        await self._start_turn(bot, command, state, partition)

    async def _flush(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        conversation = command.conversation_key
        state = await self.state.conversation(conversation)
        # merge: up to the merge window in one turn (the rest goes in the next); queue: one.
        limit = self.settings.merge_window_max if bot.busy_policy == "merge" else 1
        # Held commands stay in Redis until the turn that carries them is sent: a crash in between
        # replays this flush, and the turn's stable id makes the second send a no-op.
        while True:
            raw = await self.state.peek_held(conversation, limit)
            if not raw:
                return
            taken = [SessionCommand.model_validate_json(r) for r in raw]
            # A replayed command may have been held although its turn was sent already: drop it.
            sent = await self.state.markers("sent", [turn_message_id(c) for c in taken])
            held = [c for c, marker in zip(taken, sent, strict=True) if marker != "1"]
            if held:
                break
            await self.state.drop_held(conversation, len(raw))
        turn = merge_turns(held)
        if "held" in turn.hops:
            turn.hops["released"] = now_ms()
        if state.status != "idle" and await self.state.marker("sent", turn_message_id(turn)) != "sending":
            return  # another turn runs; its end flushes again (unless this very flush was cut short)
        await self._start_turn(bot, turn, state, partition)
        await self.state.drop_held(conversation, len(raw))

    async def _start_turn(
        self, bot: BotConfig, command: SessionCommand, state: ConversationState, partition: int
    ) -> None:
        conversation = command.conversation_key
        message_id = turn_message_id(command)
        # Claim the send before touching the conversation's state: a replay of a turn already sent
        # must not overwrite the state of the turn that runs now.
        previous = await self.state.claim_send(message_id)
        if previous == "1":
            return
        session_id = state.session_id or await self.state.session_for(conversation)
        if session_id is None:
            session_id = await self._create_session(bot, command)
        events = list(command.events)
        if command.system_text:
            events.append({"type": "system.message", "content": [{"type": "text", "text": command.system_text}]})
        if previous == "sending" and await self._in_history(session_id, events):
            # Posted before a crash: the attempt that posted it had already recorded the turn and
            # its stream in flight (before sending), so the stream's new owner finishes it. Writing
            # "running" again here could outlive that turn's end.
            await self.state.set_marker("sent", message_id)
            return
        turn = TurnContext(
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
        turn_fields = {"status": "running", "turn": turn, "interrupted": False, "last_message": None, "pending": []}
        await self._begin(
            partition, session_id, conversation, command.trace_id, state.cursor, turn_id=message_id, **turn_fields
        )
        try:
            try:
                await self._send_claimed(session_id, message_id, None, events, call="user_turn")
            except NotFoundError:
                # The session is gone (deleted, expired): start a new one and send there, once.
                log.info("session of %s is gone; creating a new one", conversation)
                await self.streams.untrack(partition, session_id)
                await self.state.unmap_session(conversation, session_id)
                session_id = await self._create_session(bot, command)
                await self._begin(
                    partition, session_id, conversation, command.trace_id, None, turn_id=message_id, **turn_fields
                )
                await self._send_claimed(session_id, message_id, None, events, call="user_turn")
        except SessionAPIError:
            # Not sent (as far as the client can tell): no idle will end this turn.
            await self.state.drop_turn(conversation, message_id)
            raise
        metrics.TURNS_STARTED.labels(command.platform, bot.busy_policy).inc()
        if self.typing is not None:
            await self.typing(bot, command.chat_id)

    async def _create_session(self, bot: BotConfig, command: SessionCommand) -> str:
        session_id = await self.provisioner.create_session()
        metrics.SESSIONS_CREATED.labels(command.platform).inc()
        await self.state.map_session(command.conversation_key, session_id)
        return session_id

    # -- control -------------------------------------------------------------------------------
    async def _interrupt(self, bot: BotConfig, command: SessionCommand) -> None:
        conversation = command.conversation_key
        state = await self.state.conversation(conversation)
        await self.state.take_held(conversation)  # /stop also drops what was waiting
        if state.status == "idle" or not state.session_id:
            await self._notice(bot, command, "stopped")  # nothing running: say so, send nothing (Ark errors)
            return
        await self.state.update_conversation(conversation, interrupted=True)
        await self._send(state.session_id, [{"type": "user.interrupt"}], call="interrupt")

    async def _answer(self, bot: BotConfig, command: SessionCommand, partition: int) -> None:
        conversation = command.conversation_key
        state = await self.state.conversation(conversation)
        if not state.session_id:
            return
        answered = {str(e.get("tool_use_id") or e.get("custom_tool_use_id")) for e in command.events}
        remaining = [p for p in state.pending if p.event_id not in answered]
        key = stable_id("answer-", conversation, *sorted(answered))
        await self._begin(
            partition,
            state.session_id,
            conversation,
            command.trace_id,
            state.cursor,
            status="running" if not remaining else "requires_action",
            pending=remaining,
        )
        await self._send_once(state.session_id, key, command.events, call=command.kind)

    # -- sending -------------------------------------------------------------------------------
    async def _begin(
        self,
        partition: int,
        session_id: str,
        conversation: str,
        trace_id: str,
        cursor: str | None,
        *,
        turn_id: str | None = None,
        **fields: Any,
    ) -> None:
        """Record the turn (a new user message: `turn_id`) and its stream in flight (one round
        trip), then hold the stream."""
        stream = InflightStream(session_id=session_id, conversation_key=conversation, cursor=cursor, trace_id=trace_id)
        await self.state.start_turn(conversation, partition, stream, turn_id=turn_id, **fields)
        await self.streams.track(partition, stream, registered=True)

    async def _send_once(self, session_id: str, marker_id: str, events: list[dict[str, Any]], *, call: str) -> None:
        """Send unless a previous attempt (before a crash) is known or found to have delivered it."""
        previous = await self.state.claim_send(marker_id)
        if previous == "1":
            return
        await self._send_claimed(session_id, marker_id, previous, events, call=call)

    async def _send_claimed(
        self, session_id: str, marker_id: str, previous: str | None, events: list[dict[str, Any]], *, call: str
    ) -> None:
        if previous == "sending" and await self._in_history(session_id, events):
            await self.state.set_marker("sent", marker_id)
            return
        await self._send(session_id, events, call=call)
        await self.state.set_marker("sent", marker_id)

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
        await self.client.send(session_id, events)
        metrics.SESSION_CALLS.labels(call, "ok").inc()

    async def _notice(self, bot: BotConfig, command: SessionCommand, kind: str) -> None:
        await self.outputs.outbound(
            self.notices.answering(
                bot,
                kind,
                command,
                outbound_id=stable_id("notice-", command.conversation_key, command.trace_id, kind),
                reply_to_message_id=command.reply_to_message_id,
            )
        )
