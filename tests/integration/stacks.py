"""One way to run a whole Switchboard for a test module: a fresh broker, Redis (shared or its own),
the simulator and one worker, with the developer's own SWITCHBOARD_* settings kept out."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from pipeline.bench.measure import wait_idle
from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.stack import Stack

#: How long every worker must report nothing in flight before a test takes the outcome as final:
#: a record produced between two stages shows in a high watermark one fetch later.
IDLE_QUIET_SECONDS = 0.5
#: The connection lease of every test stack (production's default is 6 s).
TEST_LEASE_SECONDS = 3.0


async def stack_idle(stack: Stack, *, quiet: float = IDLE_QUIET_SECONDS, timeout: float = 60.0) -> None:
    """Until the stack's workers have nothing in flight (no unread records, no pending work, no
    turn): after that no reply can still come, which proves "exactly one" without a quiet window."""
    await wait_idle(lambda: [w.url for w in stack.workers if w.is_running], quiet=quiet, timeout=timeout)


async def add_workers(stack: Stack, count: int = 1) -> None:
    """Start `count` more workers, then wait until the group has settled (every worker owns
    partitions, nothing in flight): a test starts after the joins' rebalances, not during them,
    when a record may be handled twice (harmless, but not what a test counting calls expects)."""
    for _ in range(count):
        await stack.add_worker()
    await stack_idle(stack, timeout=120)


@contextlib.contextmanager
def running_stack(
    broker_kind: str,
    *,
    name: str,
    bots_toml: str | None = None,
    redis_url: str | None = None,
    redis_aof: bool = False,
    partitions: int = 4,
    env_extra: dict[str, str] | None = None,
) -> Iterator[Stack]:
    """A started stack; `redis_url=None` gives it its own Redis (with AOF if asked); `env_extra`:
    more settings for its workers."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"sb-{name}-"))
    broker: TansuBroker | ApacheKafka = TansuBroker() if broker_kind == "tansu" else ApacheKafka()
    asyncio.run(broker.start())
    env = {
        "SWITCHBOARD_KAFKA_BOOTSTRAP": broker.bootstrap,
        "SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS": str(broker.recommended_fetch_max_wait_ms),
        "SWITCHBOARD_KAFKA_IDEMPOTENCE": str(broker.supports_idempotence).lower(),
        "SWITCHBOARD_KAFKA_SESSION_TIMEOUT_SECONDS": "6",
        "SWITCHBOARD_REDIS_PREFIX": f"{name}{uuid.uuid4().hex[:8]}:",
        "SWITCHBOARD_PARTITIONS": str(partitions),
        "SWITCHBOARD_LOG_LEVEL": "INFO",
        # Takeover after a holder's death waits out the lease: shorter than production's 6 s and
        # 1 s so the long-connection tests spend their time on traffic, not on waiting.
        "SWITCHBOARD_CONNECTION_LEASE_SECONDS": str(TEST_LEASE_SECONDS),
        "SWITCHBOARD_CONNECTION_ACQUIRE_INTERVAL_SECONDS": "0.5",
    }
    if bots_toml is not None:
        config = run_dir / "switchboard.toml"
        config.write_text(bots_toml)
        env["SWITCHBOARD_CONFIG"] = str(config)
    if redis_url is not None:
        env["SWITCHBOARD_REDIS_URL"] = redis_url
    env.update(env_extra or {})
    saved = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_")}
    for key in saved:
        del os.environ[key]  # the developer's own settings must not leak into the test stack
    stack = Stack(settings_env=env, web_port=0, think=0.0, run_dir=run_dir, redis_aof=redis_aof)
    try:
        asyncio.run(stack.start(workers=0))
        asyncio.run(add_workers(stack))
        yield stack
    finally:
        asyncio.run(stack.stop())
        asyncio.run(broker.stop())
        os.environ.update(saved)
