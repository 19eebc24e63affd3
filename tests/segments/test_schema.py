"""The generated JSON Schema: strict-provider compatible and equivalent to the models (S2, S3)."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from pipeline.segments import SEGMENT_TYPES, reply_json_schema, response_format
from pipeline.segments.schema import STRICT_ALLOWED_KEYWORDS, strict_schema_violations

SCHEMA = reply_json_schema()


def all_nodes(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.append(node)
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    found.extend(all_nodes(sub))
            else:
                found.extend(all_nodes(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(all_nodes(item))
    return found


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    Draft202012Validator.check_schema(SCHEMA)


def test_schema_uses_only_strict_mode_keywords() -> None:
    assert strict_schema_violations(SCHEMA) == []
    used: set[str] = set()
    for node in all_nodes(SCHEMA):  # `properties` maps names to schemas; names are not keywords
        used |= set(node)
    used -= set(SCHEMA["$defs"])  # the $defs mapping's own keys are definition names
    assert used <= STRICT_ALLOWED_KEYWORDS
    for forbidden in ("discriminator", "const", "oneOf", "title", "default", "minLength", "format"):
        assert forbidden not in used


def test_every_object_closed_and_fully_required() -> None:
    objects = [n for n in all_nodes(SCHEMA) if n.get("type") == "object"]
    assert len(objects) >= 15
    for node in objects:
        assert node["additionalProperties"] is False
        assert sorted(node["required"]) == sorted(node["properties"])


def test_segment_types_and_fields_match_s2() -> None:
    expected = {
        "text": {"text"},
        "markdown": {"content"},
        "mention": {"target"},
        "image": {"media"},
        "audio": {"media"},
        "video": {"media"},
        "file": {"media"},
        "reply": {"message_id"},
        "forward": {"forward_id"},
        "face": {"id"},
        "dice": set(),
        "rps": set(),
        "share": {"url", "title"},
    }
    defs = SCHEMA["$defs"]
    found: dict[str, set[str]] = {}
    for branch in SCHEMA["properties"]["segments"]["items"]["anyOf"]:
        segment = defs[branch["$ref"].rsplit("/", 1)[1]]
        [tag] = segment["properties"]["type"]["enum"]
        data = defs[segment["properties"]["data"]["$ref"].rsplit("/", 1)[1]]
        found[tag] = set(data["properties"])
    assert found == expected
    assert set(found) == set(SEGMENT_TYPES)
    assert defs["Media"]["properties"]["kind"]["enum"] == ["url", "path", "base64", "file"]
    assert defs["FaceData"]["properties"]["id"] == {"anyOf": [{"type": "string"}, {"type": "number"}]}


def test_violation_checker_catches_what_strict_mode_rejects() -> None:
    assert strict_schema_violations({"type": "object", "properties": {"a": {"type": "string"}}})
    assert strict_schema_violations({"anyOf": [{"type": "object"}]})  # root must be an object
    cyclic = {
        "type": "object",
        "properties": {"n": {"$ref": "#/$defs/N"}},
        "required": ["n"],
        "additionalProperties": False,
        "$defs": {
            "N": {
                "type": "object",
                "properties": {"n": {"$ref": "#/$defs/N"}},
                "required": ["n"],
                "additionalProperties": False,
            }
        },
    }
    assert any("cycle" in p for p in strict_schema_violations(cyclic))
    assert strict_schema_violations(
        {**SCHEMA, "properties": {"segments": {"type": "array", "minItems": 1, "items": {"type": "string"}}}}
    )


def test_response_format_shape() -> None:
    assert response_format() == {
        "type": "json_schema",
        "json_schema": {"name": "im_reply", "schema": SCHEMA, "strict": True},
    }


def test_schema_copies_are_independent() -> None:
    copy = reply_json_schema()
    copy["$defs"].clear()
    assert reply_json_schema() == SCHEMA


@pytest.mark.parametrize(
    "obj",
    [
        {"segments": []},
        {"segments": [{"type": "face", "data": {"id": 1.5}}]},
        {"segments": [{"type": "dice", "data": {}}]},
    ],
)
def test_schema_accepts_model_valid_edge_cases(obj: dict[str, Any]) -> None:
    assert Draft202012Validator(SCHEMA).is_valid(obj)
