"""finalize_reply: the order of the steps and the facts it returns."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.segments import Capabilities, OutcomeReason, Reply, finalize_reply, validate_reply
from pipeline.segments.notices import NoticeKind
from tests.segments.conftest import CONFIGURED_SECRET, TURN, make_policy


class FixedCorrector:
    def __init__(self, corrected_text: str) -> None:
        self.corrected_text = corrected_text
        self.seen: list[str] = []

    async def correct(self, invalid_text: str) -> Reply:
        self.seen.append(invalid_text)
        return validate_reply(self.corrected_text)


async def test_corrected_reply_still_goes_through_mentions_and_leak_check() -> None:
    corrected = json.dumps(
        {
            "segments": [
                {"type": "mention", "data": {"target": "424242"}},
                {"type": "text", "data": {"text": f"token {CONFIGURED_SECRET}"}},
            ]
        }
    )
    corrector = FixedCorrector(corrected)
    outcome = await finalize_reply(
        "not json", TURN, make_policy(), corrector=corrector, media=None, capabilities=Capabilities()
    )
    assert corrector.seen == ["not json"]
    assert outcome.reason is OutcomeReason.CORRECTED and outcome.corrected
    assert outcome.unknown_mentions == 1 and outcome.leak_hits == 1
    assert [s.type for s in outcome.segments] == ["text", "text"]
    assert outcome.segments[0].model_dump()["data"] == {"text": "@424242"}
    assert CONFIGURED_SECRET not in outcome.segments[1].model_dump_json()


async def test_block_after_correction_reports_both_facts() -> None:
    corrected = json.dumps({"segments": [{"type": "text", "data": {"text": CONFIGURED_SECRET}}]})
    outcome = await finalize_reply(
        "{",
        TURN,
        make_policy(leak_action="block"),
        corrector=FixedCorrector(corrected),
        media=None,
        capabilities=Capabilities(),
    )
    assert outcome.reason is OutcomeReason.LEAK_BLOCKED and outcome.corrected and outcome.leak_hits == 1
    assert outcome.notice is not None and outcome.notice.kind is NoticeKind.LEAK_BLOCKED


async def test_corrected_empty_reply_is_no_reply() -> None:
    outcome = await finalize_reply(
        "nope",
        TURN,
        make_policy(),
        corrector=FixedCorrector('{"segments":[]}'),
        media=None,
        capabilities=Capabilities(),
    )
    assert outcome.reason is OutcomeReason.NO_REPLY and outcome.corrected and outcome.sends_nothing


async def test_notice_language_follows_turn_then_policy() -> None:
    zh_turn = TURN.__class__(**{**TURN.__dict__, "language": "zh"})
    outcome = await finalize_reply(
        "x", zh_turn, make_policy(language="en"), corrector=None, media=None, capabilities=Capabilities()
    )
    assert outcome.notice is not None and outcome.notice.text.startswith("抱歉")


def test_package_imports_no_metrics_or_transport_stack() -> None:
    probe = (
        "import sys, pipeline.segments; "
        "print(sorted(m for m in ('prometheus_client', 'faust', 'aiokafka', 'redis') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
