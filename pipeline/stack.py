"""The local stack: broker, Redis, session simulator and workers as supervised processes.

`switchboard up` runs one; the integration and fault tests run one per test module (on free
ports), kill workers with SIGKILL and start them again. Any part given by a `SWITCHBOARD_*`
setting (Kafka bootstrap, Redis URL, session base URL) is used instead of being started.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from pipeline.embedded import ApacheKafka, ManagedProcess, RedisServer, TansuBroker, free_port
from pipeline.embedded.exceptions import ServiceStartError
from pipeline.kafka import apply_topics
from pipeline.redact import redact_url
from pipeline.settings import Settings
from pipeline.topics import cluster_specs

SIM_API_KEY = "switchboard-sim-key"
SIM_OPENAPI_AK, SIM_OPENAPI_SK = "switchboard-sim-ak", "switchboard-sim-sk"


class HttpProcess(ManagedProcess):
    """A child whose readiness is an HTTP 200 on a health URL."""

    health_path = "/healthz"

    def __init__(self, port: int, *, run_dir: Path | None = None, port_chosen_here: bool = False) -> None:
        super().__init__(run_dir=run_dir)
        self.port = port
        # A port the stack picked (free a moment ago) may be taken before the child binds it (an
        # outgoing connection's ephemeral port): then the start tries another. A given one is kept.
        self._port_is_ours = port_chosen_here

    def _pick_new_port(self) -> None:
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ports(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", self.port)]

    async def _probe(self) -> bool:
        async with httpx.AsyncClient(timeout=2.0) as client:
            response = await client.get(self.url + self.health_path)
            return response.status_code == 200


class SimProcess(HttpProcess):
    name = "sim"
    health_path = "/_sim/stats"

    def __init__(
        self,
        port: int,
        *,
        think: float = 0.0,
        run_dir: Path | None = None,
        extra: list[str] | None = None,
        port_chosen_here: bool = False,
    ):
        super().__init__(port, run_dir=run_dir, port_chosen_here=port_chosen_here)
        self.think = think
        self.extra = extra or []

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pipeline.cli",
            "sim",
            "--port",
            str(self.port),
            "--api-key",
            SIM_API_KEY,
            "--think",
            str(self.think),
            "--openapi-ak",
            SIM_OPENAPI_AK,
            "--openapi-sk",
            SIM_OPENAPI_SK,
            *self.extra,
        ]


class WorkerProcess(HttpProcess):
    name = "worker"
    start_timeout = 60.0
    stop_grace = 45.0  # above the worker's shutdown drain (20 s by default)

    def __init__(
        self,
        port: int,
        env: Mapping[str, str],
        *,
        args: list[str] | None = None,
        run_dir: Path | None = None,
        port_chosen_here: bool = False,
    ):
        super().__init__(port, run_dir=run_dir, port_chosen_here=port_chosen_here)
        self.env = dict(env)
        self.args = args or []
        self.instance_id = ""

    def _prepare(self) -> None:
        # A new id per start: only this process answers /healthz with it (see pipeline/web/server.py).
        self.instance_id = secrets.token_hex(8)

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "pipeline.cli", "worker", *self.args]

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            **self.env,
            "SWITCHBOARD_WEB_PORT": str(self.port),
            "SWITCHBOARD_INSTANCE_ID": self.instance_id,
        }

    async def _probe(self) -> bool:
        """Ready when our own worker answers: another program (or another stack's worker) that
        holds the port answers with another id, or not at all."""
        async with httpx.AsyncClient(timeout=2.0) as client:
            response = await client.get(self.url + self.health_path)
            return response.status_code == 200 and response.json().get("instance") == self.instance_id

    async def wait_consuming(self, timeout: float = 120.0) -> None:
        """Until `/readyz` says ready: the worker's stages consume (its consumer group's join is
        done), so a message sent now is answered as fast as later ones. A started worker serves
        before that; the join takes seconds (a broker's initial rebalance delay, other members)."""
        deadline = time.monotonic() + timeout
        last = "no answer"
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if not self.is_running:
                    raise ServiceStartError(
                        f"{self.name} exited while joining its consumer group (code {self.exit_code}); "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                try:
                    response = await client.get(self.url + "/readyz")
                    if response.status_code == 200:
                        return
                    last = response.text
                except httpx.HTTPError as exc:
                    last = repr(exc)
                if time.monotonic() > deadline:
                    raise ServiceStartError(
                        f"{self.name} not consuming after {timeout:.0f} s (last /readyz: {last}); "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                await asyncio.sleep(0.1)


@dataclass
class Stack:
    """Everything on one machine. `env` holds the settings every worker of this stack gets."""

    settings_env: dict[str, str] = field(default_factory=dict)
    web_port: int = 8080
    think: float = 0.0
    run_dir: Path | None = None
    # The embedded Redis with an append-only file, so its state survives a restart (as in production).
    redis_aof: bool = False
    # The broker started when no SWITCHBOARD_KAFKA_BOOTSTRAP is given: Tansu (in memory, starts in
    # a second) or Apache Kafka (a JVM; its fetches do not slow down as the log grows).
    embedded_broker: Literal["tansu", "kafka"] = "tansu"
    broker: TansuBroker | ApacheKafka | None = None
    redis: RedisServer | None = None
    sim: SimProcess | None = None
    workers: list[WorkerProcess] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    # Workers whose start began: names each one's run dir, so two started at once (a replacement and
    # another fault's) get their own dir and log.
    _workers_begun: int = field(default=0, init=False, repr=False)

    async def start(self, *, workers: int = 1) -> None:
        env = {k: v for k, v in os.environ.items() if k.startswith("SWITCHBOARD_")}
        env.update(self.settings_env)
        # The local stack (`switchboard up`, the tests, the benchmarks) is the console's home: on
        # unless switched off explicitly. Workers of a deployment keep it off by default.
        env.setdefault("SWITCHBOARD_CONSOLE_ENABLED", "true")
        if not env.get("SWITCHBOARD_KAFKA_BOOTSTRAP"):
            if self.embedded_broker == "kafka":
                self.broker = ApacheKafka(run_dir=self._dir("broker"))
            else:
                self.broker = TansuBroker(run_dir=self._dir("broker"))
            await self.broker.start()
            env["SWITCHBOARD_KAFKA_BOOTSTRAP"] = self.broker.bootstrap
            env.setdefault("SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS", str(self.broker.recommended_fetch_max_wait_ms))
            env.setdefault("SWITCHBOARD_KAFKA_IDEMPOTENCE", str(self.broker.supports_idempotence).lower())
        if not env.get("SWITCHBOARD_REDIS_URL"):
            self.redis = RedisServer(run_dir=self._dir("redis"), aof=self.redis_aof, appendfsync="everysec")
            await self.redis.start()
            env["SWITCHBOARD_REDIS_URL"] = self.redis.url
        if not env.get("SWITCHBOARD_SESSION_BASE_URL"):
            self.sim = SimProcess(free_port(), think=self.think, run_dir=self._dir("sim"), port_chosen_here=True)
            await self.sim.start()
            # The default profile, ark, with sessions created through the simulator's signed
            # control plane (as a real Ark deployment would use Volcengine OpenAPI).
            env["SWITCHBOARD_SESSION_BASE_URL"] = f"{self.sim.url}/api/v3"
            env["SWITCHBOARD_SESSION_PROFILE"] = "ark"
            env["SWITCHBOARD_SESSION_API_KEY"] = SIM_API_KEY
            env["SWITCHBOARD_SESSION_PROVISIONER"] = "ark-openapi"
            env["SWITCHBOARD_SESSION_AGENT_ID"] = "switchboard-agent"  # any id: the simulator runs one agent
            env["SWITCHBOARD_ARK_OPENAPI_URL"] = self.sim.url
            env["SWITCHBOARD_ARK_ACCESS_KEY"] = SIM_OPENAPI_AK
            env["SWITCHBOARD_ARK_SECRET_KEY"] = SIM_OPENAPI_SK
            env.setdefault("SWITCHBOARD_CORRECTION_BASE_URL", self.sim.url)
            env.setdefault("SWITCHBOARD_CORRECTION_API_KEY", SIM_API_KEY)
        self.env = env
        await self.apply_topics()
        for index in range(workers):
            await self.add_worker(self.web_port if index == 0 else 0)

    async def apply_topics(self) -> None:
        settings = self.settings()
        assert settings.kafka_bootstrap
        await apply_topics(settings.kafka_bootstrap, cluster_specs(settings))

    def settings(self) -> Settings:
        saved = dict(os.environ)
        try:
            os.environ.update(self.env)
            return Settings()
        finally:
            os.environ.clear()
            os.environ.update(saved)

    async def add_worker(self, port: int = 0, args: list[str] | None = None) -> WorkerProcess:
        index, self._workers_begun = self._workers_begun, self._workers_begun + 1
        worker = WorkerProcess(
            port or free_port(), self.env, args=args, run_dir=self._dir(f"worker{index}"), port_chosen_here=not port
        )
        await worker.start()
        self.workers.append(worker)
        return worker

    async def stop(self) -> None:
        for part in [*reversed(self.workers), self.sim, self.redis, self.broker]:
            if part is not None:
                try:
                    await part.stop()
                except Exception:  # stop the rest regardless
                    pass

    def _dir(self, name: str) -> Path | None:
        if self.run_dir is None:
            return None
        path = self.run_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def parts(self) -> list[tuple[str, ManagedProcess]]:
        """(name, process) of every part this stack started, in start order."""
        named: list[tuple[str, ManagedProcess | None]] = [
            ("broker", self.broker),
            ("redis", self.redis),
            ("sim", self.sim),
        ]
        named += [(f"worker {i}", worker) for i, worker in enumerate(self.workers)]
        return [(name, part) for name, part in named if part is not None]

    def broker_name(self) -> str:
        return "Apache Kafka" if isinstance(self.broker, ApacheKafka) else "Tansu"

    def describe(self) -> list[tuple[str, str]]:
        """(name, where) of each part, for the banner: URLs without their passwords."""

        def where(variable: str, note: str) -> str:
            return redact_url(self.env.get(variable, "")) + note

        rows = [
            ("kafka", where("SWITCHBOARD_KAFKA_BOOTSTRAP", f" (embedded {self.broker_name()})" if self.broker else "")),
            ("redis", where("SWITCHBOARD_REDIS_URL", " (embedded)" if self.redis else "")),
            ("session API", where("SWITCHBOARD_SESSION_BASE_URL", " (switchboard sim)" if self.sim else "")),
        ]
        for i, worker in enumerate(self.workers):
            rows.append((f"worker {i}", f"{worker.url}  (webhooks /webhooks/…, /metrics, /healthz, /readyz)"))
        if self.workers:
            rows.append(("console", f"{self.workers[0].url}/console/"))
        return rows


async def wait_forever() -> None:
    await asyncio.Event().wait()
