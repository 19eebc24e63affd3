"""Property tests: accepted replies are schema-valid; rejected replies never leak any part of themselves."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from pipeline.segments import (
    SEGMENT_TYPES,
    Capabilities,
    CorrectionFailed,
    OutcomeReason,
    Reply,
    ReplyInvalid,
    finalize_reply,
    reply_json_schema,
    validate_reply,
)
from pipeline.segments.notices import DEFAULT_NOTICES, NoticeKind
from tests.segments.conftest import TURN, make_policy
from tests.segments.helpers import strict_json_loads

VALIDATOR = Draft202012Validator(reply_json_schema())
PROPERTY_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

strings = st.text(max_size=30)
ids = st.one_of(st.sampled_from(["10001", "10002", "77777", ""]), strings)
face_ids = st.one_of(strings, st.integers(), st.floats(allow_nan=False, allow_infinity=False))
media_objects = st.fixed_dictionaries({"kind": st.sampled_from(["url", "path", "base64", "file"]), "value": strings})


def data_for(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    by_kind: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "text": st.fixed_dictionaries({"text": strings}),
        "markdown": st.fixed_dictionaries({"content": strings}),
        "mention": st.fixed_dictionaries({"target": ids}),
        "reply": st.fixed_dictionaries({"message_id": strings}),
        "forward": st.fixed_dictionaries({"forward_id": strings}),
        "face": st.fixed_dictionaries({"id": face_ids}),
        "dice": st.just({}),
        "rps": st.just({}),
        "share": st.fixed_dictionaries({"url": strings, "title": strings}),
    }
    return by_kind.get(kind, st.fixed_dictionaries({"media": media_objects}))


valid_segment = st.sampled_from(
    [
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
    ]
).flatmap(lambda kind: data_for(kind).map(lambda data: {"type": kind, "data": data}))

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), strings)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(strings, inner, max_size=3)),
    max_leaves=6,
)


@st.composite
def mutated(draw: st.DrawFn, node: Any) -> Any:
    """Randomly break one spot of a JSON value: drop/add a key, swap a value's type, rename a tag."""
    if isinstance(node, dict) and node and draw(st.booleans()):
        key = draw(st.sampled_from(sorted(node)))
        action = draw(st.sampled_from(["drop", "add", "replace", "recurse"]))
        changed = dict(node)
        if action == "drop":
            del changed[key]
        elif action == "add":
            changed[draw(strings)] = draw(json_values)
        elif action == "replace":
            changed[key] = draw(json_values)
        else:
            changed[key] = draw(mutated(node[key]))
        return changed
    if isinstance(node, list) and node and draw(st.booleans()):
        index = draw(st.integers(0, len(node) - 1))
        changed_list = list(node)
        changed_list[index] = draw(mutated(node[index]))
        return changed_list
    return draw(st.one_of(st.just(node), json_values))


replies = st.lists(valid_segment, max_size=6).map(lambda segments: {"segments": segments})
candidate_objects = st.one_of(replies, replies.flatmap(mutated))


@st.composite
def candidate_texts(draw: st.DrawFn) -> str:
    obj = draw(candidate_objects)
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 2])))
    wrapper = draw(st.sampled_from(["none", "none", "none", "fence", "prose", "trailing", "cut"]))
    if wrapper == "fence":
        return f"```json\n{text}\n```"
    if wrapper == "prose":
        return f"Here is the reply: {text}"
    if wrapper == "trailing":
        return f"{text}\nThanks!"
    if wrapper == "cut":
        return text[: draw(st.integers(0, max(0, len(text) - 1)))]
    return text


def schema_accepts(text: str) -> bool:
    try:
        return VALIDATOR.is_valid(strict_json_loads(text))
    except ValueError:
        return False


@PROPERTY_SETTINGS
@given(candidate_texts())
def test_accepted_replies_reserialise_schema_valid_and_models_agree_with_schema(text: str) -> None:
    try:
        reply = validate_reply(text)
    except ReplyInvalid:
        assert not schema_accepts(text)
        return
    assert schema_accepts(text)
    dumped = json.loads(reply.model_dump_json())
    assert VALIDATOR.is_valid(dumped)
    assert dumped == json.loads(text)  # nothing coerced, added or dropped


class EchoCorrector:
    """A corrector that 'corrects' by returning the same text: always still invalid."""

    calls = 0

    async def correct(self, invalid_text: str) -> Reply:
        self.calls += 1
        try:
            return validate_reply(invalid_text)
        except ReplyInvalid as invalid:
            raise CorrectionFailed(f"still_invalid:{invalid.reason}") from None


_DETAIL_SHAPE = re.compile(r"^[a-z0-9_?:.]*$")
FIXED_NOTICE = DEFAULT_NOTICES["en"][NoticeKind.REPLY_INVALID]


@PROPERTY_SETTINGS
@given(candidate_texts(), st.booleans())
def test_rejected_replies_never_yield_any_part_of_themselves(text: str, with_corrector: bool) -> None:
    try:
        validate_reply(text)
        return  # accepted: covered by the other property
    except ReplyInvalid:
        pass
    corrector = EchoCorrector() if with_corrector else None
    outcome = asyncio.run(
        finalize_reply(text, TURN, make_policy(), corrector=corrector, media=None, capabilities=Capabilities())
    )
    assert outcome.reason in (OutcomeReason.INVALID, OutcomeReason.CORRECTION_FAILED)
    assert outcome.segments == [] and outcome.passthrough is None and outcome.media == ()
    assert outcome.notice is not None and outcome.notice.text == FIXED_NOTICE  # fixed, input-independent
    assert _DETAIL_SHAPE.match(outcome.detail)
    # The detail is built from positions and contract vocabulary only: no 6+ char run of the input that
    # is not itself contract vocabulary appears in it.
    # The segment type names are contract vocabulary too (a detail may name the type at a position).
    vocabulary = "segments type data text content target media kind value message_id forward_id id url title"
    vocabulary += " " + " ".join(SEGMENT_TYPES)
    for start in range(max(0, len(text) - 5)):
        window = text[start : start + 6]
        if window in outcome.detail:
            assert window in vocabulary or window in "still_invalid:schema:invalid_json:not_an_object"
    if corrector is not None:
        assert corrector.calls == 1  # exactly one correction attempt
