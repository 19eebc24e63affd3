"""Topic names and declarations, read from `topics.toml` beside this module (the contract of the streams).

The catalogue and the generated JSON Schemas are package data, so an installed wheel has them.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline import records
from pipeline.kafka.declare import TopicSpec
from pipeline.settings import Settings

IM_INBOUND = "im.inbound"
SESSION_INPUT = "session.input"
SESSION_EVENTS = "session.events"
DEADLETTER = "im.deadletter"
_OUTBOUND = "im.outbound.{platform}"

TOPICS_DIR = Path(__file__).resolve().parent


def outbound_topic(platform: str) -> str:
    return _OUTBOUND.format(platform=platform)


@dataclass(frozen=True)
class TopicDeclaration:
    name: str
    partitions: int
    key: str
    value: str
    schema_file: str
    config: dict[str, str] = field(default_factory=dict)


def _catalogue(directory: Path = TOPICS_DIR) -> list[dict[str, Any]]:
    return list(tomllib.loads((directory / "topics.toml").read_text(encoding="utf-8"))["topic"])


def cluster_specs(settings: Settings) -> list[TopicSpec]:
    """What `topics apply` creates for these settings: every declared topic of the configured
    platforms, with the settings' partition count and replication factor."""
    return [
        TopicSpec(name=d.name, partitions=d.partitions, replication_factor=settings.replication_factor, config=d.config)
        for d in declarations(settings.platforms, settings.partitions)
    ]


def declarations(platforms: list[str], default_partitions: int, directory: Path = TOPICS_DIR) -> list[TopicDeclaration]:
    """Every topic a deployment with these platforms needs."""
    result = []
    for entry in _catalogue(directory):
        partitions = default_partitions if entry["partitions"] == "default" else int(entry["partitions"])
        names = (
            [entry["name"].format(platform=p) for p in platforms] if "{platform}" in entry["name"] else [entry["name"]]
        )
        for name in names:
            result.append(
                TopicDeclaration(
                    name=name,
                    partitions=partitions,
                    key=entry["key"],
                    value=entry["value"],
                    schema_file=entry["schema"],
                    config=dict(entry.get("config", {})),
                )
            )
    return result


def value_models() -> dict[str, type[BaseModel]]:
    """Schema file → the record model whose JSON Schema it holds."""
    return {entry["schema"]: getattr(records, entry["value"]) for entry in _catalogue()}


def render_schema(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_schemas(directory: Path = TOPICS_DIR) -> list[Path]:
    written = []
    for filename, model in value_models().items():
        path = directory / filename
        path.write_text(render_schema(model), encoding="utf-8")
        written.append(path)
    return written


def schema_drift(directory: Path = TOPICS_DIR) -> list[str]:
    """Schema files that differ from what the models generate now."""
    drift = []
    for filename, model in value_models().items():
        path = directory / filename
        if not path.exists() or path.read_text(encoding="utf-8") != render_schema(model):
            drift.append(filename)
    return drift
