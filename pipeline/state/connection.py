"""The Redis connection every worker uses: redis-py's, with commands packed by hiredis and round
trips counted.

redis-py's asyncio connection packs commands in Python (41 µs for a script call with a turn's keys
and arguments, against 5.6 µs for hiredis's C packer: `bench/redis_client_bench.py`), and the
stores send long script calls on every turn. The bytes are the same.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import Connection

from pipeline import metrics

_PACK = getattr(hiredis, "pack_command", None)


class RedisConnection(Connection):
    def pack_command(self, *args: Any) -> list[bytes]:
        if _PACK is None:  # an old hiredis: redis-py's own packer
            return super().pack_command(*args)
        first = args[0]
        # A command name with its subcommand in one string ("CLIENT SETNAME"): sent as two words.
        if isinstance(first, str) and " " in first:
            args = (*first.split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        return [_PACK(args)]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # One packed send per round trip: a command, a pipeline or a script call.
        metrics.REDIS_ROUND_TRIPS.inc()
        await super().send_packed_command(command, check_health)
