"""Helpers behind the pytest fixtures in tests/conftest.py (importable for type hints)."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Mapping

from pipeline.kafka.declare import TopicSpec, apply_topics

_SLUG = re.compile(r"[^a-zA-Z0-9]+")
_COUNTER = itertools.count()


def unique_name(prefix: str = "t", scope: str = "", *, max_len: int = 100) -> str:
    """``prefix-scope-N-xxxxxxxx``: legal as a Kafka topic, consumer group or Redis key prefix."""
    slug = _SLUG.sub("-", scope).strip("-").lower()[:48]
    parts = [_SLUG.sub("-", prefix).strip("-") or "t"]
    if slug:
        parts.append(slug)
    parts += [str(next(_COUNTER)), uuid.uuid4().hex[:8]]
    return "-".join(parts)[-max_len:].lstrip("-.")


class TopicFactory:
    """Creates uniquely named topics on one broker: ``name = await topic_factory(partitions=3)``."""

    def __init__(self, bootstrap: str, scope: str = "") -> None:
        self.bootstrap = bootstrap
        self.scope = scope
        self.created: list[str] = []

    async def __call__(
        self,
        partitions: int = 1,
        *,
        name: str | None = None,
        config: Mapping[str, str] | None = None,
        prefix: str = "topic",
    ) -> str:
        names = [name] if name else None
        return (await self.many(1, partitions, names=names, config=config, prefix=prefix))[0]

    async def many(
        self,
        count: int,
        partitions: int = 1,
        *,
        names: list[str] | None = None,
        config: Mapping[str, str] | None = None,
        prefix: str = "topic",
    ) -> list[str]:
        """Create ``count`` topics at once; returns their names once every partition has a leader."""
        names = names or [unique_name(prefix, self.scope) for _ in range(count)]
        specs = [TopicSpec(n, partitions, 1, dict(config or {})) for n in names]
        report = await apply_topics(self.bootstrap, specs)
        if not report.ok:
            raise RuntimeError(f"topic_factory could not create {names}: {report.errors}")
        self.created.extend(names)
        return names
