"""The reply corpus (tests/segments/corpus/replies.jsonl): every case's outcome, reason and counts."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pipeline.segments import OutcomeReason, ReplyInvalid, finalize_reply, reply_json_schema, validate_reply
from pipeline.segments.notices import NoticeKind
from tests.segments.conftest import TURN, make_policy
from tests.segments.helpers import load_corpus, strict_json_loads

CASES = load_corpus()
SCHEMA_VALIDATOR = Draft202012Validator(reply_json_schema())


def test_corpus_is_large_and_covers_every_outcome() -> None:
    assert len(CASES) >= 150
    expectations = {case["expect"] for case in CASES}
    assert {"ok", "no_reply", "invalid", "unknown_mention", "leak_blocked"} <= expectations
    covered_types = set()
    for case in CASES:
        if case["expect"] == "ok":
            covered_types |= {s["type"] for s in json.loads(case["text"])["segments"]}
    assert len(covered_types) == 13


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
async def test_corpus_case(case: dict[str, Any], capabilities: Any) -> None:
    policy = make_policy(**case.get("policy", {}))
    outcome = await finalize_reply(case["text"], TURN, policy, corrector=None, media=None, capabilities=capabilities)
    expect = case["expect"]
    expected_reason = {
        "ok": OutcomeReason.OK,
        "no_reply": OutcomeReason.NO_REPLY,
        "invalid": OutcomeReason.INVALID,
        "unknown_mention": OutcomeReason.UNKNOWN_MENTION,
        "leak_blocked": OutcomeReason.LEAK_BLOCKED,
    }[expect]
    assert outcome.reason is expected_reason, outcome.detail
    assert outcome.leak_hits == case.get("leak_hits", 0)
    assert outcome.unknown_mentions == case.get("unknown_mentions", 0)
    assert outcome.media_rejected == case.get("media_rejected", 0)
    assert outcome.corrected is False

    if "detail" in case:
        assert outcome.detail.startswith(case["detail"])
    sent = json.dumps([s.model_dump(mode="json") for s in outcome.segments], ensure_ascii=False)
    if outcome.notice is not None:
        sent += outcome.notice.text
    if "must_not_contain" in case:
        assert case["must_not_contain"] not in sent
    if "plain_mention_text" in case:
        assert {"type": "text", "data": {"text": case["plain_mention_text"]}} in json.loads(sent)

    if expect in ("invalid", "unknown_mention"):
        assert outcome.segments == [] and outcome.notice is not None
        assert outcome.notice.kind is NoticeKind.REPLY_INVALID
    elif expect == "leak_blocked":
        assert outcome.segments == [] and outcome.notice is not None
        assert outcome.notice.kind is NoticeKind.LEAK_BLOCKED
    elif expect == "no_reply":
        assert outcome.sends_nothing
    else:
        assert outcome.notice is None and outcome.segments
        clean = not (outcome.leak_hits or outcome.unknown_mentions or outcome.media_rejected)
        if clean:
            # Sent exactly as written, in the same order (S1).
            assert [s.model_dump(mode="json") for s in outcome.segments] == json.loads(case["text"])["segments"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_corpus_models_and_schema_agree(case: dict[str, Any]) -> None:
    """Model-valid ⇔ schema-valid on every corpus text (with a strict RFC 8259 JSON reader)."""
    try:
        validate_reply(case["text"])
        model_valid = True
    except ReplyInvalid:
        model_valid = False
    try:
        schema_valid = SCHEMA_VALIDATOR.is_valid(strict_json_loads(case["text"]))
    except ValueError:
        schema_valid = False
    assert model_valid == schema_valid
    assert model_valid == (case["expect"] != "invalid")
