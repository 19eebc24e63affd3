"""`pipeline/topics/` is the contract: its JSON Schemas match the record models (regenerate with
`switchboard topics schemas`), and every declared topic is consistent."""

from __future__ import annotations

import json

import jsonschema

from pipeline import topics
from pipeline.records import InboundMessage, Sender


def test_schema_files_match_the_models() -> None:
    assert topics.schema_drift() == [], "run `switchboard topics schemas` and commit pipeline/topics/"


def test_every_schema_is_a_valid_json_schema() -> None:
    for filename in topics.value_models():
        schema = json.loads((topics.TOPICS_DIR / filename).read_text())
        jsonschema.Draft202012Validator.check_schema(schema)


def test_a_record_validates_against_its_published_schema() -> None:
    record = InboundMessage(
        platform="console",
        bot_id="b",
        chat_id="c",
        chat_type="group",
        sender=Sender(user_id="u"),
        message_id="m",
        text="hi",
        conversation_key="console:b:c",
        trace_id="t",
    )
    schema = json.loads((topics.TOPICS_DIR / "im.inbound.schema.json").read_text())
    jsonschema.validate(json.loads(record.model_dump_json()), schema)


def test_stage_topics_share_one_partition_count() -> None:
    declared = {d.name: d for d in topics.declarations(["console", "slack"], 12)}
    assert {declared[n].partitions for n in ("im.inbound", "session.input", "session.events")} == {12}
    assert "im.outbound.console" in declared and "im.outbound.slack" in declared
    assert declared["im.deadletter"].partitions == 1
