"""A worker's runtime and web server on a free port, against the session's real Redis.

`start_worker(**settings)` starts `Runtime` (its Redis pool, the stages) and `Runtime.start_web` on
127.0.0.1 with those settings; what the web server produces (webhooks, dead letters) is recorded
instead of going to a broker. Stopped at the end of the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from pipeline.runtime import Runtime
from pipeline.settings import BotConfig, Settings
from tests.platforms.test_ingress_checks import Produced  # records what would go to the broker

TOKEN = "console-token-for-tests"
ADMIN = "boss"


def console_bot(bot_id: str = "locked", token: str | None = TOKEN, **extra: Any) -> BotConfig:
    credentials = {"token": token} if token else {}
    return BotConfig.model_validate(
        {"platform": "console", "bot_id": bot_id, "self_id": "bot", "language": "en", "credentials": credentials}
        | extra
    )


@dataclass
class Worker:
    runtime: Runtime
    produced: Produced
    url: str
    port: int

    @property
    def settings(self) -> Settings:
        return self.runtime.settings


StartWorker = Callable[..., Awaitable[Worker]]


@pytest.fixture
async def start_worker(redis_url: str, redis_prefix: str) -> AsyncIterator[StartWorker]:
    started: list[Runtime] = []

    async def start(**overrides: Any) -> Worker:
        values: dict[str, Any] = {
            "redis_url": redis_url,
            "redis_prefix": redis_prefix,
            "console_enabled": True,
            "bots": [console_bot(admins=[ADMIN])],
            "session_provisioner": "static",
            "session_static_ids": ["s-1"],
        }
        values.update(overrides)
        produced = Produced()
        runtime = Runtime(Settings(**values), send=produced)
        started.append(runtime)
        await runtime.start()
        port = await runtime.start_web(runtime.settings.web_host, 0)
        return Worker(runtime, produced, f"http://127.0.0.1:{port}", port)

    yield start
    for runtime in reversed(started):
        await runtime.stop()
