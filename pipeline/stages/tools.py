"""IM tools an agent may call as custom tools: answered by Switchboard, never left waiting.

Registered: `im_send_message` (send a message to the chat now), `im_lookup_member` (find member ids
by name in the group-context window), `im_recent_history` (the recent group messages). Any other
custom tool gets `is_error: true` with a clear message, so the session never waits forever.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pipeline.segments.models import Segment, TextData, TextSegment
from pipeline.settings import BotConfig, Settings
from pipeline.state import ConversationStore, PendingAction, TurnRecord


@dataclass
class ToolResult:
    text: str
    is_error: bool = False
    outbound: list[Segment] | None = None  # segments to send to the chat now


class ImTools:
    NAMES = ("im_send_message", "im_lookup_member", "im_recent_history")

    def __init__(self, settings: Settings, conversations: ConversationStore) -> None:
        self.settings = settings
        self.conversations = conversations

    def known(self, name: str) -> bool:
        return name in self.NAMES

    async def run(self, bot: BotConfig, conversation: str, turn: TurnRecord | None, call: PendingAction) -> ToolResult:
        if call.name == "im_send_message":
            text = call.input.get("text")
            if not isinstance(text, str) or not text.strip():
                return ToolResult("im_send_message needs a non-empty string `text`", is_error=True)
            return ToolResult("sent", outbound=[TextSegment(type="text", data=TextData(text=text))])
        if call.name == "im_lookup_member":
            name = str(call.input.get("name") or "").strip().lower()
            if not name:
                return ToolResult("im_lookup_member needs `name`", is_error=True)
            window = await self.conversations.context(conversation, self.settings.group_context_size)
            matches = {e.user_id: e.name for e in window if name in e.name.lower()}
            if turn is not None and matches:
                known = list(dict.fromkeys([*turn.known_ids, *matches]))
                await self.conversations.update_conversation(
                    conversation, turn=turn.model_copy(update={"known_ids": known})
                )
            return ToolResult(json.dumps([{"user_id": k, "name": v} for k, v in matches.items()], ensure_ascii=False))
        if call.name == "im_recent_history":
            limit = call.input.get("limit")
            size = (
                min(int(limit), self.settings.group_context_size)
                if isinstance(limit, int) and limit > 0
                else (self.settings.group_context_size)
            )
            window = await self.conversations.context(conversation, size)
            return ToolResult(
                json.dumps([{"user_id": e.user_id, "name": e.name, "text": e.text} for e in window], ensure_ascii=False)
            )
        return ToolResult(
            f"The custom tool {call.name!r} is not available in this chat (Switchboard has no handler for it).",
            is_error=True,
        )
