"""The Lua scripts of the stores (`scripts/*.lua`, package data), called by SHA-1: one round trip
each (the client loads a script again when Redis lost it, after a restart without AOF)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from .client import Script


@cache
def script(name: str) -> Script:
    return Script(resources.files("pipeline.state").joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8"))
