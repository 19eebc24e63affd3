"""Mention targets must be ids known to the turn (S5, S7)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.segments.context import MentionPolicy, TurnContext
from pipeline.segments.models import MentionSegment, Segment, TextData, TextSegment


@dataclass(frozen=True, slots=True)
class MentionCheck:
    segments: list[Segment]
    unknown_mentions: int


def check_mentions(segments: list[Segment], ctx: TurnContext, policy: MentionPolicy) -> MentionCheck:
    """Replace (PLAIN) or count (REJECT) mentions of ids the turn does not know; ALLOW keeps all.

    Under PLAIN an unknown target becomes the text `@target`: visible, but it notifies nobody. The
    caller decides what REJECT means (finalize treats it as an invalid reply).
    """
    if policy is MentionPolicy.ALLOW or not any(s.type == "mention" for s in segments):
        return MentionCheck(segments, 0)
    known = ctx.mentionable_ids()
    out: list[Segment] = []
    unknown = 0
    for segment in segments:
        if isinstance(segment, MentionSegment) and segment.data.target not in known:
            unknown += 1
            if policy is MentionPolicy.PLAIN:
                out.append(TextSegment(type="text", data=TextData(text=f"@{segment.data.target}")))
                continue
        out.append(segment)
    return MentionCheck(out, unknown)
