"""No password of a URL setting reaches the terminal: the `up` banner, preflight refusals and broker
errors show each URL through one helper (pipeline.redact) that hides passwords and keeps the rest,
and the leak check looks for the same passwords."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.embedded import RedisServer, free_port
from pipeline.kafka import BrokerUnavailableError
from pipeline.kafka.admin import admin_client
from pipeline.redact import redact_url, url_passwords
from pipeline.stack import Stack
from tests.cli.support import Up, run

PASSWORD = "R3disPassw0rd!"
ENCODED = "R3disPassw0rd%21"


@pytest.mark.parametrize(
    ("url", "shown", "passwords"),
    [
        (f"redis://:{ENCODED}@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0", [PASSWORD]),
        ("rediss://app:pw-1@redis:6380/2", "rediss://app:***@redis:6380/2", ["pw-1"]),
        (
            "redis+sentinel://:a@s1:26379,s2:26379/mymaster/0?sentinel_password=b%2Bc&x=1",
            "redis+sentinel://:***@s1:26379,s2:26379/mymaster/0?sentinel_password=***&x=1",
            ["a", "b+c"],
        ),
        ("sasl_ssl://bob:k4fka@b1:9093,b2:9093", "sasl_ssl://bob:***@b1:9093,b2:9093", ["k4fka"]),
        ("127.0.0.1:9092,broker:9092", "127.0.0.1:9092,broker:9092", []),  # nothing to hide
        ("https://user@api.example/v3", "https://user@api.example/v3", []),  # a user name alone stays
    ],
)
def test_redact_url_hides_passwords_and_keeps_the_address(url: str, shown: str, passwords: list[str]) -> None:
    assert redact_url(url) == shown
    assert list(url_passwords(url)) == passwords


def test_the_banner_rows_show_no_password() -> None:
    stack = Stack(
        env={
            "SWITCHBOARD_KAFKA_BOOTSTRAP": "sasl_ssl://bob:K4fkaPassw0rd@b1:9093",
            "SWITCHBOARD_REDIS_URL": f"redis://:{ENCODED}@127.0.0.1:6379/0",
            "SWITCHBOARD_SESSION_BASE_URL": "https://agent:S3ssionPassw0rd@api.example/api/v3",
        }
    )
    rows = dict(stack.describe())
    assert rows["kafka"] == "sasl_ssl://bob:***@b1:9093"
    assert rows["redis"] == "redis://:***@127.0.0.1:6379/0"
    assert rows["session API"] == "https://agent:***@api.example/api/v3"


def test_refusals_name_the_server_without_its_password() -> None:
    redis_port, kafka_port = free_port(), free_port()  # nothing listens: both are refused
    result = run(
        "worker",
        env={
            "SWITCHBOARD_KAFKA_BOOTSTRAP": f"sasl_ssl://bob:K4fkaPassw0rd@127.0.0.1:{kafka_port}",
            "SWITCHBOARD_REDIS_URL": f"redis://:{ENCODED}@127.0.0.1:{redis_port}/0",
            "SWITCHBOARD_SESSION_BASE_URL": "http://127.0.0.1:9/api/v3",
            "SWITCHBOARD_SESSION_API_KEY": "test-key",
            "SWITCHBOARD_SESSION_PROVISIONER": "static",
            "SWITCHBOARD_SESSION_STATIC_IDS": '["sesn-1"]',
            "SWITCHBOARD_CONSOLE_ENABLED": "true",
            "SWITCHBOARD_WEB_PORT": "0",
        },
    )
    assert result.returncode == 1, result.stderr
    assert f"cannot reach Kafka at sasl_ssl://bob:***@127.0.0.1:{kafka_port}" in result.stderr, result.stderr
    assert f"cannot reach Redis at 127.0.0.1:{redis_port}/0" in result.stderr, result.stderr
    for secret in ("K4fkaPassw0rd", PASSWORD, ENCODED):
        assert secret not in result.stderr + result.stdout


async def test_broker_errors_name_the_server_without_its_password() -> None:
    bootstrap = f"sasl_plaintext://bob:K4fkaPassw0rd@127.0.0.1:{free_port()}"
    with pytest.raises(BrokerUnavailableError) as caught:
        async with admin_client(bootstrap):
            pass
    assert "K4fkaPassw0rd" not in str(caught.value) and "bob:***@" in str(caught.value)


@pytest.fixture
def redis_with_password(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD, run_dir=tmp_path / "redis") as server:
        yield server


@pytest.mark.integration
def test_up_banner_hides_the_redis_password(redis_with_password: RedisServer, tmp_path: Path) -> None:
    url = f"redis://:{ENCODED}@127.0.0.1:{redis_with_password.port}/0"
    up = Up(free_port(), tmp_path / "run", env={"SWITCHBOARD_REDIS_URL": url})
    try:
        up.wait_for_banner()
    finally:
        up.kill()
    assert f"redis://:***@127.0.0.1:{redis_with_password.port}/0" in up.output, up.output
    assert PASSWORD not in up.output and ENCODED not in up.output
    worker_log = (tmp_path / "run" / "worker0" / "worker.log").read_text()
    assert PASSWORD not in worker_log and ENCODED not in worker_log
