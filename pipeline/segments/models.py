"""The segment models of the IM reply contract (S1-S3).

Every object is closed and every field required (S3), and validation is strict (S10): no coercion
of a number into a string or back.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AllowInfNan, BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr, TypeAdapter

_CLOSED = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Closed(BaseModel):
    model_config = _CLOSED


class TextData(_Closed):
    text: StrictStr


class MarkdownData(_Closed):
    content: StrictStr


class MentionData(_Closed):
    target: StrictStr


MediaKind = Literal["url", "path", "base64", "file"]


class Media(_Closed):
    kind: MediaKind
    value: StrictStr


class MediaData(_Closed):
    media: Media


class ReplyData(_Closed):
    message_id: StrictStr


class ForwardData(_Closed):
    forward_id: StrictStr


# The seed types face ids as `string | number` (a JSON number, not only an integer). Numbers must be
# finite: JSON has no NaN/Infinity, and `1e400` overflows to inf when parsed.
FiniteNumber = StrictInt | Annotated[StrictFloat, AllowInfNan(False)]


class FaceData(_Closed):
    id: StrictStr | FiniteNumber


class EmptyData(_Closed):
    pass


class ShareData(_Closed):
    url: StrictStr
    title: StrictStr


class TextSegment(_Closed):
    type: Literal["text"]
    data: TextData


class MarkdownSegment(_Closed):
    type: Literal["markdown"]
    data: MarkdownData


class MentionSegment(_Closed):
    type: Literal["mention"]
    data: MentionData


class ImageSegment(_Closed):
    type: Literal["image"]
    data: MediaData


class AudioSegment(_Closed):
    type: Literal["audio"]
    data: MediaData


class VideoSegment(_Closed):
    type: Literal["video"]
    data: MediaData


class FileSegment(_Closed):
    type: Literal["file"]
    data: MediaData


class ReplySegment(_Closed):
    type: Literal["reply"]
    data: ReplyData


class ForwardSegment(_Closed):
    type: Literal["forward"]
    data: ForwardData


class FaceSegment(_Closed):
    type: Literal["face"]
    data: FaceData


class DiceSegment(_Closed):
    type: Literal["dice"]
    data: EmptyData


class RpsSegment(_Closed):
    type: Literal["rps"]
    data: EmptyData


class ShareSegment(_Closed):
    type: Literal["share"]
    data: ShareData


Segment = Annotated[
    TextSegment
    | MarkdownSegment
    | MentionSegment
    | ImageSegment
    | AudioSegment
    | VideoSegment
    | FileSegment
    | ReplySegment
    | ForwardSegment
    | FaceSegment
    | DiceSegment
    | RpsSegment
    | ShareSegment,
    Field(discriminator="type"),
]

MediaSegment = ImageSegment | AudioSegment | VideoSegment | FileSegment

SEGMENT_TYPES: tuple[str, ...] = (
    "text",
    "markdown",
    "mention",
    "image",
    "audio",
    "video",
    "file",
    "reply",
    "forward",
    "face",
    "dice",
    "rps",
    "share",
)
MEDIA_SEGMENT_TYPES: frozenset[str] = frozenset({"image", "audio", "video", "file"})
MEDIA_KINDS: tuple[str, ...] = ("url", "path", "base64", "file")


class Reply(_Closed):
    """The whole final reply: `{"segments": [...]}` (S1)."""

    segments: list[Segment]


segment_list_adapter: TypeAdapter[list[Segment]] = TypeAdapter(list[Segment])

reply_adapter: TypeAdapter[Reply] = TypeAdapter(Reply)
