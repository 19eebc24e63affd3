"""The leak check every outbound message passes, whatever produced it.

Egress runs it on each `im.outbound.<platform>` record before rendering it for the platform: final
replies (already checked by the segments contract, so normally clean here), progress messages, IM
tool messages (`im_send_message`), confirmation prompts (which quote the tool's name and input), and
every host notice. The strings of a message are read as one text, so a secret split across segments
is found. A hit is cut out (the bot's `leak_policy = "redact"`), or the whole message is replaced by
the leak notice (`"block"`, and always when a hit has no position that could be cut).
"""

from __future__ import annotations

import logging

from pipeline import metrics
from pipeline.records import OutboundMessage
from pipeline.segments import LeakScanner
from pipeline.segments.leaks import scan_segments
from pipeline.segments.models import TextData, TextSegment
from pipeline.segments.notices import NoticeKind
from pipeline.settings import BotConfig

from .notify import Notifier

log = logging.getLogger(__name__)


class LeakGuard:
    def __init__(self, scanner: LeakScanner, notifier: Notifier) -> None:
        self.scanner = scanner
        self.notifier = notifier

    def check(self, bot: BotConfig, message: OutboundMessage) -> OutboundMessage:
        """`message` if it carries no secret, else a copy with the secrets cut out or blocked."""
        result = scan_segments(message.segments, self.scanner)
        if not result.hits:
            return message
        metrics.LEAK_HITS.labels(message.platform, message.kind).inc(result.hits)
        blocked = bot.leak_policy == "block" or result.unmappable
        log.info(
            "outbound %s (%s): %d secret(s) %s",
            message.outbound_id,
            message.kind,
            result.hits,
            "blocked" if blocked else "redacted",
        )
        if not blocked:
            return message.model_copy(update={"segments": result.segments})
        metrics.NOTICES.labels(message.platform, NoticeKind.LEAK_BLOCKED.value).inc()
        notice = TextSegment(type="text", data=TextData(text=self.notifier.text(bot, NoticeKind.LEAK_BLOCKED)))
        return message.model_copy(update={"segments": [notice]})
