"""The JSON Schema of the reply contract, generated from the models (S3).

Pydantic's schema is post-processed into the subset that strict structured-output providers
(OpenAI/Ark `json_schema` with `strict: true`) accept: `type`, `properties`, `required`,
`additionalProperties`, `enum`, `anyOf`, `items`, `$defs`, `$ref`, `description`. Discriminated unions
become plain `anyOf`, `const` becomes a one-value `enum`, titles are dropped and every object lists
all its properties as required.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from typing import Any

from pipeline.segments.models import Reply

SCHEMA_NAME = "im_reply"

# Keywords a strict structured-output provider accepts (OpenAI strict mode's documented subset).
STRICT_ALLOWED_KEYWORDS: frozenset[str] = frozenset(
    {"type", "properties", "required", "additionalProperties", "enum", "anyOf", "items", "$defs", "$ref", "description"}
)


def _to_strict(node: Any) -> Any:
    if isinstance(node, list):
        return [_to_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("title", "discriminator", "default"):
            continue
        if key == "properties":
            # Property names are data here, not keywords: convert each property's schema only.
            out[key] = {name: _to_strict(sub) for name, sub in value.items()}
        elif key == "const":
            out["enum"] = [value]
        elif key == "oneOf":
            # The segment types are mutually exclusive by their `type` enum, so anyOf is equivalent.
            branches = _to_strict(value)
            out["anyOf"] = branches
        elif key == "anyOf":
            branches = _to_strict(value)
            # `int | float` comes out as integer|number; number already covers integers.
            if {"type": "number"} in branches:
                branches = [b for b in branches if b != {"type": "integer"}]
            out["anyOf"] = branches
        else:
            out[key] = _to_strict(value)
    if out.get("type") == "object":
        out["additionalProperties"] = False
        out["required"] = list(out.setdefault("properties", {}))
    return out


@cache
def _reply_schema_text() -> str:
    schema = _to_strict(Reply.model_json_schema())
    schema["description"] = 'The final IM reply: {"segments": [...]}; order is kept; [] means no reply.'
    return json.dumps(schema, ensure_ascii=False, sort_keys=True)


def reply_json_schema() -> dict[str, Any]:
    """A fresh copy of the strict JSON Schema of `Reply` (callers may mutate it)."""
    return copy.deepcopy(json.loads(_reply_schema_text()))


def reply_json_schema_text() -> str:
    """The schema as compact JSON text (cached), for prompts and request bodies."""
    return _reply_schema_text()


def response_format() -> dict[str, Any]:
    """The chat-completions `response_format` that asks for the reply contract in strict mode."""
    return {
        "type": "json_schema",
        "json_schema": {"name": SCHEMA_NAME, "schema": reply_json_schema(), "strict": True},
    }


def strict_schema_violations(schema: dict[str, Any]) -> list[str]:
    """Reasons why a provider's strict mode would reject `schema` (empty list = acceptable).

    Checks: only allowed keywords; every object closed with every property required; the root is an
    object; `$ref`s point into `$defs` and do not form a cycle.
    """
    problems: list[str] = []
    defs: dict[str, Any] = schema.get("$defs", {})

    def walk(node: Any, where: str) -> None:
        if not isinstance(node, dict):
            problems.append(f"{where}: schema is not an object")
            return
        for key in node:
            if key not in STRICT_ALLOWED_KEYWORDS:
                problems.append(f"{where}: unsupported keyword {key!r}")
        if node.get("type") == "object":
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: object without additionalProperties:false")
            props = node.get("properties", {})
            if sorted(node.get("required", [])) != sorted(props):
                problems.append(f"{where}: not every property is required")
            for name, sub in props.items():
                walk(sub, f"{where}.properties.{name}")
        if "items" in node:
            walk(node["items"], f"{where}.items")
        for index, sub in enumerate(node.get("anyOf", [])):
            walk(sub, f"{where}.anyOf[{index}]")
        ref = node.get("$ref")
        if ref is not None and (not ref.startswith("#/$defs/") or ref[len("#/$defs/") :] not in defs):
            problems.append(f"{where}: $ref {ref!r} does not point into $defs")

    if schema.get("type") != "object":
        problems.append("root: must be an object schema")
    walk({k: v for k, v in schema.items() if k != "$defs"}, "root")
    for name, sub in defs.items():
        walk(sub, f"$defs.{name}")

    # Cycle check over the $ref graph.
    def refs_of(node: Any) -> set[str]:
        found: set[str] = set()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                found.add(ref[len("#/$defs/") :])
            for value in node.values():
                found |= refs_of(value)
        elif isinstance(node, list):
            for value in node:
                found |= refs_of(value)
        return found

    graph = {name: refs_of(sub) for name, sub in defs.items()}
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            problems.append(f"$defs.{name}: $ref cycle")
            return
        visiting.add(name)
        for nxt in graph.get(name, ()):
            visit(nxt)
        visiting.discard(name)
        done.add(name)

    for name in graph:
        visit(name)
    return problems
