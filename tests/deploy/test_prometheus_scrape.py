"""A real Prometheus (the Debian `prometheus` binary) scrapes a running worker; the metric comes back
through Prometheus's HTTP API. Proves /metrics is scrapable and the catalogue's names are what a
Prometheus stores (what the alerts and the dashboard query)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest
import yaml

from pipeline.embedded import free_port
from pipeline.stack import Stack
from tests.deploy.support import PROMETHEUS_HINT, tool
from tests.integration.console import ConsoleClient

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="session")
def prometheus_binary() -> str:
    """Session-scoped so a missing binary skips before the (module-scoped) stack starts."""
    return tool("prometheus", PROMETHEUS_HINT)


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    async def query(self, expr: str) -> float | None:
        """The value of a one-series instant query, or None while there is none."""
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.get(f"{self.url}/api/v1/query", params={"query": expr})
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        result = body["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    async def wait_for(self, expr: str, *, above: float = 0.0, within: float = 20.0) -> float:
        deadline = time.monotonic() + within
        last = None
        while time.monotonic() < deadline:
            last = await self.query(expr)
            if last is not None and last > above:
                return last
            await asyncio.sleep(0.25)
        raise AssertionError(f"{expr} = {last} after {within}s (wanted > {above})")


@pytest.fixture
def prometheus(prometheus_binary: str, stack: Stack, tmp_path: Path) -> Iterator[Prometheus]:
    worker = urlparse(stack.workers[0].url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "switchboard",
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [worker.netloc]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (tmp_path / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            prometheus_binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 15
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "prometheus not ready: " + (tmp_path / "prometheus.log").read_text()
            time.sleep(0.1)
        yield Prometheus(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


async def test_prometheus_scrapes_a_worker(prometheus: Prometheus, console: ConsoleClient) -> None:
    # The worker is a target and up.
    assert await prometheus.wait_for('up{job="switchboard"}') == 1.0
    # One message through the whole pipeline: counted at ingress, and end to end once delivered.
    chat = console.chat("prom")
    await console.send(chat, "hello prometheus")
    await console.wait_for(chat, 1)
    accepted = await prometheus.wait_for('sum(switchboard_inbound_accepted_total{platform="console"})')
    assert accepted >= 1
    delivered = await prometheus.wait_for('sum(switchboard_end_to_end_seconds_count{platform="console"})')
    assert delivered >= 1
    # Histogram buckets are stored under the names the alerts and the dashboard use.
    assert await prometheus.wait_for('count(switchboard_end_to_end_seconds_bucket{platform="console"})', above=1) > 1
