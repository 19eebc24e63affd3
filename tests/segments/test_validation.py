"""validate_reply: strict parsing and content-free reasons (S8, S10)."""

from __future__ import annotations

import json

import pytest

from pipeline.segments import FaceSegment, ReplyInvalid, validate_reply
from pipeline.segments.validation import validate_reply_object


def test_valid_reply_parses_to_models() -> None:
    reply = validate_reply('{"segments":[{"type":"face","data":{"id":14}},{"type":"dice","data":{}}]}')
    assert isinstance(reply.segments[0], FaceSegment) and reply.segments[0].data.id == 14
    assert [s.type for s in reply.segments] == ["face", "dice"]


def test_no_reply_is_valid() -> None:
    assert validate_reply('{"segments": []}').segments == []


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "invalid_json"),
        ("hello", "invalid_json"),
        ('```json\n{"segments":[]}\n```', "invalid_json"),
        ('{"segments":[]} trailing', "invalid_json"),
        ("[]", "not_an_object"),
        ("{}", "schema:segments:missing"),
        (
            '{"segments":[{"type":"mention","data":{"target":123}}]}',
            "schema:segments.0.mention.data.target:string_type",
        ),
        ('{"segments":[{"type":"whisper","data":{}}]}', "schema:segments.0:union_tag_invalid"),
        ('{"segments":[],"password_is_hunter2":1}', "schema:?:extra_forbidden"),
    ],
)
def test_reasons_are_short_and_content_free(text: str, reason: str) -> None:
    with pytest.raises(ReplyInvalid) as invalid:
        validate_reply(text)
    assert invalid.value.reason == reason
    assert str(invalid.value) == reason
    assert "hunter2" not in repr(invalid.value)
    assert invalid.value.__cause__ is None  # pydantic's error (which quotes the input) is not chained


def test_not_text_is_rejected() -> None:
    with pytest.raises(ReplyInvalid):
        validate_reply(b'{"segments":[]}')  # type: ignore[arg-type]


def test_validate_object_uses_the_same_rules() -> None:
    assert validate_reply_object({"segments": [{"type": "rps", "data": {}}]}).segments[0].type == "rps"
    with pytest.raises(ReplyInvalid):
        validate_reply_object({"segments": [{"type": "reply", "data": {"message_id": 5}}]})


def test_round_trip_is_exact() -> None:
    text = json.dumps({"segments": [{"type": "face", "data": {"id": 2.5}}, {"type": "text", "data": {"text": "é"}}]})
    assert json.loads(validate_reply(text).model_dump_json()) == json.loads(text)
