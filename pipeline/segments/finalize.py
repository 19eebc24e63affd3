"""The one entry point of the render stage: agent reply text in, safe segments or a notice out.

Order of the steps, and why:
1. validate strictly (S8, S10); on failure at most one correction call (S9, S11), else the notice;
2. mentions (S5, S7) before the leak check, so an unknown target turned into text is also scanned;
3. leak check on every string, read as one text (S14): redact in place, or block the whole reply
   (always blocked when a hit cannot be mapped to positions, see `leaks`);
4. media (S15) last, so no byte is fetched for a reply that is blocked anyway.
Facts (counts, corrected, reasons) are returned; the caller turns them into metrics and logs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import jsonschema

from pipeline.segments.context import Capabilities, MentionPolicy, OutputMode, ReplyPolicy, TurnContext
from pipeline.segments.exceptions import CorrectionFailed, ReplyInvalid
from pipeline.segments.leaks import LeakAction, scan_segments
from pipeline.segments.media import CheckedMedia, MediaCheck, MediaChecker, with_placeholders
from pipeline.segments.mentions import check_mentions
from pipeline.segments.models import MEDIA_SEGMENT_TYPES, Reply, Segment, TextData, TextSegment
from pipeline.segments.notices import Notice, NoticeKind
from pipeline.segments.validation import validate_reply


class OutcomeReason(StrEnum):
    OK = "ok"  # valid reply, sent as segments
    NO_REPLY = "no_reply"  # `{"segments": []}` (or empty plain text): send nothing
    CORRECTED = "corrected"  # invalid at first, valid after the one correction call
    INVALID = "invalid"  # invalid and no correction endpoint configured → notice
    CORRECTION_FAILED = "correction_failed"  # the correction call failed or was still invalid → notice
    UNKNOWN_MENTION = "unknown_mention"  # mention policy `reject` and an unknown target → notice
    LEAK_BLOCKED = "leak_blocked"  # leak action `block` and a secret found → notice
    PLAIN_TEXT = "plain_text"  # S19 plain mode
    CALLER_SCHEMA = "caller_schema"  # S20: passed through under the caller's contract
    CALLER_SCHEMA_INVALID = "caller_schema_invalid"  # caller's schema given and not met → notice


class ReplyCorrector(Protocol):
    """What finalize needs from a corrector (`Corrector` implements it; tests may pass their own)."""

    async def correct(self, invalid_text: str) -> Reply: ...


@dataclass(frozen=True, slots=True)
class ReplyOutcome:
    """What to send for a turn's final reply, and the facts about how it was obtained.

    Exactly one of: `notice` set (send the host notice, `segments` is empty), `segments` non-empty
    (send them), `passthrough` set (caller-schema mode), or nothing at all (no reply).
    `detail` is a short content-free code (e.g. the validation or correction failure reason).
    """

    segments: list[Segment]
    notice: Notice | None
    reason: OutcomeReason
    detail: str = ""
    corrected: bool = False
    leak_hits: int = 0
    media_rejected: int = 0
    unknown_mentions: int = 0
    media: tuple[CheckedMedia, ...] = ()
    passthrough: str | None = None

    @property
    def sends_nothing(self) -> bool:
        return self.notice is None and not self.segments and self.passthrough is None


def _notice(kind: NoticeKind, ctx: TurnContext, policy: ReplyPolicy) -> Notice:
    return policy.notices.render(kind, language=ctx.language or policy.language, bot_id=ctx.bot_id)


def _capability_only(segments: list[Segment], capabilities: Capabilities, unavailable: str) -> MediaCheck:
    # Without a media checker nothing is read, but unsupported media types are still replaced.
    checked: list[CheckedMedia] = []
    for index, segment in enumerate(segments):
        if segment.type not in MEDIA_SEGMENT_TYPES:
            continue
        kind = segment.data.media.kind  # type: ignore[union-attr]
        if segment.type in capabilities.supported_segment_types:
            checked.append(CheckedMedia(index, segment.type, kind, True, "unchecked"))
        else:
            checked.append(CheckedMedia(index, segment.type, kind, False, "unsupported_by_platform"))
    rejected = [c.index for c in checked if not c.accepted]
    if not rejected:
        return MediaCheck(segments, checked, 0)
    return MediaCheck(with_placeholders(segments, rejected, unavailable), checked, len(rejected))


async def _finish_segments(
    segments: list[Segment],
    ctx: TurnContext,
    policy: ReplyPolicy,
    *,
    reason: OutcomeReason,
    corrected: bool,
    media: MediaChecker | None,
    capabilities: Capabilities,
    apply_mentions: bool,
) -> ReplyOutcome:
    unknown_mentions = 0
    if apply_mentions:
        mention_check = check_mentions(segments, ctx, policy.mention_policy)
        unknown_mentions = mention_check.unknown_mentions
        if unknown_mentions and policy.mention_policy is MentionPolicy.REJECT:
            # Correction only fixes format; it cannot know ids, so no correction call here.
            return ReplyOutcome(
                [],
                _notice(NoticeKind.REPLY_INVALID, ctx, policy),
                OutcomeReason.UNKNOWN_MENTION,
                detail="unknown_mention",
                corrected=corrected,
                unknown_mentions=unknown_mentions,
            )
        segments = mention_check.segments

    leak = scan_segments(segments, policy.leak_scanner)
    if leak.hits and (policy.leak_action is LeakAction.BLOCK or leak.unmappable):
        # An unmappable hit (only in what the markdown shows) has no clean cut: the reply is blocked.
        return ReplyOutcome(
            [],
            _notice(NoticeKind.LEAK_BLOCKED, ctx, policy),
            OutcomeReason.LEAK_BLOCKED,
            detail="leak_unmappable" if leak.unmappable else "leak_blocked",
            corrected=corrected,
            leak_hits=leak.hits,
            unknown_mentions=unknown_mentions,
        )
    unavailable = _notice(NoticeKind.ATTACHMENT_UNAVAILABLE, ctx, policy).text
    leak_dropped: list[CheckedMedia] = []
    for index in sorted(leak.hit_positions):
        # A media reference that carried a secret is not fetched with the secret cut out (that would
        # fetch a different resource); the attachment is dropped instead.
        segment = segments[index]
        if segment.type in MEDIA_SEGMENT_TYPES:
            kind = segment.data.media.kind  # type: ignore[union-attr]
            leak_dropped.append(CheckedMedia(index, segment.type, kind, False, "leak"))
    segments = with_placeholders(leak.segments, [c.index for c in leak_dropped], unavailable)

    if media is not None:
        media_check = await media.check_segments(segments, capabilities, unavailable)
    else:
        media_check = _capability_only(segments, capabilities, unavailable)
    checked = tuple(sorted([*media_check.checked, *leak_dropped], key=lambda c: c.index))
    return ReplyOutcome(
        media_check.segments,
        None,
        reason,
        corrected=corrected,
        leak_hits=leak.hits,
        media_rejected=media_check.rejected + len(leak_dropped),
        unknown_mentions=unknown_mentions,
        media=checked,
    )


_CALLER_VALIDATOR_CACHE_SIZE = 64
_caller_validators: dict[int, tuple[Any, jsonschema.protocols.Validator]] = {}


def _caller_validator(schema: Any) -> jsonschema.protocols.Validator:
    # Building a validator costs far more than using one; cache per schema object (kept alive here).
    cached = _caller_validators.get(id(schema))
    if cached is None or cached[0] is not schema:
        if len(_caller_validators) >= _CALLER_VALIDATOR_CACHE_SIZE:
            _caller_validators.clear()  # policies are built once per bot; this only bounds misuse
        validator_class = jsonschema.validators.validator_for(schema)
        cached = (schema, validator_class(schema))
        _caller_validators[id(schema)] = cached
    return cached[1]


def _json_strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, list):
        for item in value:
            _json_strings(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _json_strings(item, out)


def _with_json_strings(value: Any, strings: Iterator[str]) -> Any:
    # `value` with its strings replaced, in the order `_json_strings` listed them.
    if isinstance(value, str):
        return next(strings)
    if isinstance(value, list):
        return [_with_json_strings(item, strings) for item in value]
    if isinstance(value, dict):
        return {key: _with_json_strings(item, strings) for key, item in value.items()}
    return value


def _finish_caller_schema(text: str, ctx: TurnContext, policy: ReplyPolicy) -> ReplyOutcome:
    # S20: the caller's contract. Never interpreted as segments; secrets are still kept in (S14).
    try:
        parsed: Any = json.loads(text)
        is_json = True
    except ValueError:
        parsed, is_json = None, False
    if policy.caller_schema is not None:
        if not is_json or not _caller_validator(policy.caller_schema).is_valid(parsed):
            return ReplyOutcome(
                [],
                _notice(NoticeKind.REPLY_INVALID, ctx, policy),
                OutcomeReason.CALLER_SCHEMA_INVALID,
                detail="caller_schema",
            )
    if is_json:
        # Scan the parsed strings (read as one text, like segments), not the JSON text, so escapes
        # are decoded and a redaction never breaks the JSON.
        strings: list[str] = []
        _json_strings(parsed, strings)
        scanned = policy.leak_scanner.scan_texts(strings)
        hits = scanned.hits
        out_text = json.dumps(_with_json_strings(parsed, iter(scanned.texts)), ensure_ascii=False) if hits else text
    else:
        result = policy.leak_scanner.scan(text)
        out_text, hits = result.text, result.hits
    if hits and policy.leak_action is LeakAction.BLOCK:
        return ReplyOutcome(
            [],
            _notice(NoticeKind.LEAK_BLOCKED, ctx, policy),
            OutcomeReason.LEAK_BLOCKED,
            detail="leak_blocked",
            leak_hits=hits,
        )
    return ReplyOutcome([], None, OutcomeReason.CALLER_SCHEMA, leak_hits=hits, passthrough=out_text)


async def finalize_reply(
    text: str,
    ctx: TurnContext,
    policy: ReplyPolicy,
    *,
    corrector: ReplyCorrector | None,
    media: MediaChecker | None,
    capabilities: Capabilities,
) -> ReplyOutcome:
    """Turn the agent's final reply text into what the chat receives (see the module docstring).

    `corrector=None` (no endpoint configured) sends an invalid reply straight to the notice.
    `media=None` reads no media (only the platform's supported types are enforced).
    Cancellation (e.g. the turn is stopped during the correction call) propagates.
    """
    if policy.output_mode is OutputMode.CALLER_SCHEMA:
        return _finish_caller_schema(text, ctx, policy)
    if policy.output_mode is OutputMode.PLAIN:
        if not text.strip():
            return ReplyOutcome([], None, OutcomeReason.NO_REPLY)
        plain: list[Segment] = [TextSegment(type="text", data=TextData(text=text))]
        return await _finish_segments(
            plain,
            ctx,
            policy,
            reason=OutcomeReason.PLAIN_TEXT,
            corrected=False,
            media=None,
            capabilities=capabilities,
            apply_mentions=False,
        )

    corrected = False
    reason = OutcomeReason.OK
    try:
        reply = validate_reply(text)
    except ReplyInvalid as invalid:
        if corrector is None:
            return ReplyOutcome(
                [],
                _notice(NoticeKind.REPLY_INVALID, ctx, policy),
                OutcomeReason.INVALID,
                detail=invalid.reason,
            )
        try:
            reply = await corrector.correct(text)
        except CorrectionFailed as failed:
            return ReplyOutcome(
                [],
                _notice(NoticeKind.REPLY_INVALID, ctx, policy),
                OutcomeReason.CORRECTION_FAILED,
                detail=failed.reason,
            )
        corrected = True
        reason = OutcomeReason.CORRECTED

    if not reply.segments:
        return ReplyOutcome([], None, OutcomeReason.NO_REPLY, corrected=corrected)
    return await _finish_segments(
        list(reply.segments),
        ctx,
        policy,
        reason=reason,
        corrected=corrected,
        media=media,
        capabilities=capabilities,
        apply_mentions=True,
    )
