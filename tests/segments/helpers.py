"""Helpers shared by the segments tests (not fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS_PATH = Path(__file__).parent / "corpus" / "replies.jsonl"


def load_corpus() -> list[dict[str, Any]]:
    with CORPUS_PATH.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _check_strings(value: Any) -> None:
    if isinstance(value, str):
        value.encode("utf-8")  # lone surrogates are not Unicode text
    elif isinstance(value, list):
        for item in value:
            _check_strings(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key)
            _check_strings(item)


def _finite_float(text: str) -> float:
    number = float(text)
    if number in (float("inf"), float("-inf")):
        raise ValueError("number overflows to infinity")
    return number


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key")
    return obj


def strict_json_loads(text: str) -> Any:
    """RFC 8259 JSON, strictly: no NaN/Infinity, no overflow to inf, no lone surrogates, no duplicate keys."""
    value = json.loads(
        text, parse_constant=_reject_constant, parse_float=_finite_float, object_pairs_hook=_unique_pairs
    )
    _check_strings(value)
    return value
