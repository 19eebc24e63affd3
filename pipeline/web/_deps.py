"""What the web app's handlers are given."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from pipeline.settings import Settings
from pipeline.stages.outputs import Outputs
from pipeline.stages.refused_early import EarlyRefusals
from pipeline.state import ConsoleStore

from ._hub import ConsoleHub

# (topic, key, value) → awaited until the broker acknowledged the record.
ProduceAcked = Callable[[str, str | None, bytes], Awaitable[None]]


@dataclass
class ConsoleDeps:
    store: ConsoleStore  # on the console's own Redis connections
    hub: ConsoleHub


@dataclass
class WebDeps:
    settings: Settings
    produce: ProduceAcked
    outputs: Outputs
    ready: Callable[[], Awaitable[dict[str, bool]]]
    console: ConsoleDeps | None = None  # set when the console is enabled
    # The triggers the workers' ingest found over a limit: dropped once parsed (none by default).
    refusals: EarlyRefusals = field(default_factory=EarlyRefusals)


DEPS = web.AppKey("deps", WebDeps)
STATIC_DIR = web.AppKey("static", Path)
