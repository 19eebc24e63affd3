"""The notifier: host-written notices as outbound messages (their texts: `pipeline.segments.notices`)."""

from __future__ import annotations

from typing import Any

from pipeline import metrics
from pipeline.records import InboundMessage, OutboundKind, OutboundMessage, SessionCommand
from pipeline.segments.models import TextData, TextSegment
from pipeline.segments.notices import NoticeCatalog, NoticeKind
from pipeline.settings import BotConfig, Settings


class Notifier:
    def __init__(self, settings: Settings) -> None:
        self.catalog = NoticeCatalog(
            bot_overrides={bot.bot_id: {bot.language: dict(bot.notices)} for bot in settings.bots if bot.notices}
        )

    def text(self, bot: BotConfig, kind: NoticeKind | str, **params: str) -> str:
        return self.catalog.render(NoticeKind(kind), language=bot.language, bot_id=bot.bot_id, **params).text

    def answering(
        self,
        bot: BotConfig,
        kind: NoticeKind | str,
        record: InboundMessage | SessionCommand,
        *,
        outbound_id: str,
        reply_to_message_id: str | None,
        params: dict[str, str] | None = None,
    ) -> OutboundMessage:
        """A notice to the chat a record came from, with its routing and hop times."""
        return self.outbound(
            bot,
            kind,
            params=params,
            platform=record.platform,
            chat_id=record.chat_id,
            chat_type=record.chat_type,
            conversation_key=record.conversation_key,
            outbound_id=outbound_id,
            reply_to_message_id=reply_to_message_id,
            route=record.route,
            trace_id=record.trace_id,
            hops=record.hops,
        )

    def outbound(
        self,
        bot: BotConfig,
        kind: NoticeKind | str,
        *,
        params: dict[str, str] | None = None,
        message_kind: OutboundKind = "notice",
        **routing: Any,
    ) -> OutboundMessage:
        metrics.NOTICES.labels(bot.platform, str(NoticeKind(kind).value)).inc()
        return OutboundMessage(
            kind=message_kind,
            bot_id=bot.bot_id,
            segments=[TextSegment(type="text", data=TextData(text=self.text(bot, kind, **(params or {}))))],
            **routing,
        )
