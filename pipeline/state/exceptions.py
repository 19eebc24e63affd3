"""Errors of the state package."""

from redis.exceptions import BusyLoadingError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pipeline.errors import SwitchboardError


class StateError(SwitchboardError):
    """Redis answered something the stores did not expect."""


# Redis unreachable or not ready (restarting, loading its AOF): a retry outlives these.
UNAVAILABLE: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, BusyLoadingError)
