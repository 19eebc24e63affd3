"""The IM reply contract: segment models, validation, correction, leak and media checks.

Knows nothing about Kafka or sessions.
"""

from pipeline.segments.models import (
    SEGMENT_TYPES,
    Media,
    MediaKind,
    Reply,
    Segment,
    segment_list_adapter,
)

__all__ = ["SEGMENT_TYPES", "Media", "MediaKind", "Reply", "Segment", "segment_list_adapter"]
