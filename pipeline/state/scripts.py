"""The Lua scripts of the stores (`scripts/*.lua`, package data), called by sha: one round trip
each (redis-py loads a script again when Redis lost it, after a restart without AOF)."""

from __future__ import annotations

from functools import cache
from importlib import resources

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


@cache
def source(name: str) -> str:
    return resources.files("pipeline.state").joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")


def script(redis: Redis, name: str) -> AsyncScript:
    return redis.register_script(source(name))
