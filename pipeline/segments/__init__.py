"""The IM reply contract: segment models, validation, correction, leak and media checks.

Knows nothing about Kafka or sessions: it takes the agent's final reply text and a turn context and
returns validated, safe segments or a host-written notice, with the reason and counts (the render
stage turns those into metrics).
"""

from pipeline.segments.context import (
    Capabilities,
    Member,
    MentionPolicy,
    OutputMode,
    RepliedMessage,
    ReplyPolicy,
    TurnContext,
)
from pipeline.segments.correction import CorrectionSettings, Corrector
from pipeline.segments.exceptions import (
    CorrectionFailed,
    MediaUnavailable,
    ReplyInvalid,
    SegmentsError,
    UnsafeAddress,
)
from pipeline.segments.fetch import SafeFetcher
from pipeline.segments.finalize import OutcomeReason, ReplyCorrector, ReplyOutcome, finalize_reply
from pipeline.segments.leaks import LeakAction, LeakScanner
from pipeline.segments.media import CheckedMedia, MediaChecker, MediaSettings
from pipeline.segments.models import (
    SEGMENT_TYPES,
    AudioSegment,
    DiceSegment,
    FaceSegment,
    FileSegment,
    ForwardSegment,
    ImageSegment,
    MarkdownSegment,
    Media,
    MediaKind,
    MentionSegment,
    Reply,
    ReplySegment,
    RpsSegment,
    Segment,
    ShareSegment,
    TextSegment,
    VideoSegment,
    segment_list_adapter,
)
from pipeline.segments.notices import Notice, NoticeCatalog, NoticeKind
from pipeline.segments.prompt import build_im_prompt
from pipeline.segments.schema import reply_json_schema, response_format
from pipeline.segments.validation import validate_reply

__all__ = [
    "SEGMENT_TYPES",
    "AudioSegment",
    "Capabilities",
    "CheckedMedia",
    "CorrectionFailed",
    "CorrectionSettings",
    "Corrector",
    "DiceSegment",
    "FaceSegment",
    "FileSegment",
    "ForwardSegment",
    "ImageSegment",
    "LeakAction",
    "LeakScanner",
    "MarkdownSegment",
    "Media",
    "MediaChecker",
    "MediaKind",
    "MediaSettings",
    "MediaUnavailable",
    "Member",
    "MentionPolicy",
    "MentionSegment",
    "Notice",
    "NoticeCatalog",
    "NoticeKind",
    "OutcomeReason",
    "OutputMode",
    "RepliedMessage",
    "Reply",
    "ReplyCorrector",
    "ReplyInvalid",
    "ReplyOutcome",
    "ReplyPolicy",
    "ReplySegment",
    "RpsSegment",
    "SafeFetcher",
    "Segment",
    "SegmentsError",
    "ShareSegment",
    "TextSegment",
    "TurnContext",
    "UnsafeAddress",
    "VideoSegment",
    "build_im_prompt",
    "finalize_reply",
    "reply_json_schema",
    "response_format",
    "segment_list_adapter",
    "validate_reply",
]
