"""A whole Switchboard per test module: a fresh broker (Tansu, or Apache Kafka when enabled), the
session's shared Redis under a unique prefix, the simulator and worker processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.embedded import RedisServer
from pipeline.stack import Stack
from tests.conftest import enabled_brokers

from .console import ConsoleClient
from .stacks import running_stack

BOTS_TOML = """
[[bots]]
platform = "console"
bot_id = "demo"
self_id = "bot"
language = "en"
busy_policy = "merge"
admins = ["boss"]

[[bots]]
platform = "console"
bot_id = "locked"
self_id = "bot"
language = "en"
credentials = { token = "it-console-token" }

[[bots]]
platform = "console"
bot_id = "queue"
self_id = "bot"
language = "en"
busy_policy = "queue"

[[bots]]
platform = "console"
bot_id = "anyone"
self_id = "bot"
language = "en"
busy_policy = "interrupt"
confirm_policy = "anyone"
"""


@pytest.fixture(scope="module", params=enabled_brokers())
def stack(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Stack]:
    with running_stack(request.param, name="it", bots_toml=BOTS_TOML, redis_url=redis_server.url) as stack:
        yield stack


@pytest.fixture
def console(stack: Stack) -> ConsoleClient:
    return ConsoleClient(stack)
