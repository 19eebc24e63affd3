"""A whole Switchboard per test module: a fresh broker (Tansu, or Apache Kafka when enabled), the
session's shared Redis under a unique prefix, the simulator and worker processes."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.embedded import ApacheKafka, RedisServer, TansuBroker
from pipeline.stack import Stack
from tests.conftest import enabled_brokers

from .console import ConsoleClient

BOTS_TOML = """
[[bots]]
platform = "console"
bot_id = "demo"
self_id = "bot"
language = "en"
busy_policy = "merge"

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
    run_dir = Path(tempfile.mkdtemp(prefix="sb-it-"))
    config = run_dir / "switchboard.toml"
    config.write_text(BOTS_TOML)
    broker: TansuBroker | ApacheKafka = TansuBroker() if request.param == "tansu" else ApacheKafka()
    asyncio.run(broker.start())
    env = {
        "SWITCHBOARD_CONFIG": str(config),
        "SWITCHBOARD_KAFKA_BOOTSTRAP": broker.bootstrap,
        "SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS": str(broker.recommended_fetch_max_wait_ms),
        "SWITCHBOARD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
        "SWITCHBOARD_REDIS_URL": redis_server.url,
        "SWITCHBOARD_REDIS_PREFIX": f"it{uuid.uuid4().hex[:8]}:",
        "SWITCHBOARD_PARTITIONS": "4",
        "SWITCHBOARD_LOG_LEVEL": "INFO",
    }
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_")}
    for key in saved:
        del os.environ[key]  # the developer's own settings must not leak into the test stack
    stack = Stack(settings_env=env, web_port=0, think=0.0, run_dir=run_dir)
    try:
        asyncio.run(stack.start(workers=0))
        asyncio.run(stack.add_worker())
        yield stack
    finally:
        asyncio.run(stack.stop())
        asyncio.run(broker.stop())
        os.environ.update(saved)


@pytest.fixture
def console(stack: Stack) -> ConsoleClient:
    return ConsoleClient(stack)
