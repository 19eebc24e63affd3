"""deploy/redis/start-server.sh, which the compose file starts its Redis servers with: the role the
sentinels give a server decides over the one its options give, so a primary that restarts after a
failover comes back as the new primary's replica instead of serving its old data."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pipeline.embedded.redis import redis_server_binary
from pipeline.embedded.redis_sentinel import SentinelTopology
from pipeline.state.client import RedisClient
from tests.deploy.support import DEPLOY

SCRIPT = DEPLOY / "redis" / "start-server.sh"

# Answers like redis-cli's: the reply of the sentinel on port $2 of `-h H -p P …`, from a file per
# port; no file is a sentinel that is down (redis-cli exits 1 and prints to stderr).
FAKE_REDIS_CLI = """#!/bin/sh
port=$4
[ -f "$ANSWERS/$port" ] || { echo "Could not connect to Redis at $2:$port: Connection refused" >&2; exit 1; }
cat "$ANSWERS/$port"
"""


def start_server(
    tmp_path: Path, answers: dict[int, str], *options: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The script with `echo` as the server, so its output is the command line it would exec."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    cli = bin_dir / "redis-cli"
    cli.write_text(FAKE_REDIS_CLI)
    cli.chmod(0o755)
    answers_dir = tmp_path / "answers"
    answers_dir.mkdir(exist_ok=True)
    for port, reply in answers.items():
        (answers_dir / str(port)).write_text(reply)
    environment = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "ANSWERS": str(answers_dir), **env}
    return subprocess.run(
        ["sh", str(SCRIPT), "echo", *options], env=environment, capture_output=True, text=True, timeout=30, check=False
    )


SENTINELS = "s1:1001 s2:1002 s3:1003"


REPLICA = ("redis-replica", "redis-server --replicaof redis 6379")  # its name, its options (compose)
PRIMARY = ("redis", "redis-server --appendonly yes")


@pytest.mark.parametrize(
    ("server", "answers", "expected"),
    [
        (REPLICA, {}, "redis-server --replicaof redis 6379 --replica-announce-ip redis-replica"),
        (
            REPLICA,
            {1001: "redis\n6379\n", 1002: "redis\n6379\n", 1003: "redis\n6379\n"},
            "redis-server --replicaof redis 6379 --replicaof redis 6379 --replica-announce-ip redis-replica",
        ),
        (  # after a failover: the old primary comes back as the new one's replica
            PRIMARY,
            {1001: "redis-replica\n6379\n", 1003: "redis-replica\n6379\n"},
            "redis-server --appendonly yes --replicaof redis-replica 6379 --replica-announce-ip redis",
        ),
        (  # the sentinels name this server: the primary, whatever its options say
            REPLICA,
            {1001: "redis-replica\n6379\n", 1002: "redis-replica\n6379\n"},
            "redis-server --replicaof redis 6379 --replicaof no one --replica-announce-ip redis-replica",
        ),
        (  # one sentinel has not caught up with the failover yet: the majority decides
            REPLICA,
            {1001: "redis\n6379\n", 1002: "redis-replica\n6379\n", 1003: "redis-replica\n6379\n"},
            "redis-server --replicaof redis 6379 --replicaof no one --replica-announce-ip redis-replica",
        ),
        (  # errors and nil replies are no answer
            REPLICA,
            {1001: "NOAUTH Authentication required.\n", 1002: "\n", 1003: "ERR No such master with that name\n"},
            "redis-server --replicaof redis 6379 --replica-announce-ip redis-replica",
        ),
    ],
    ids=["no-sentinel-up", "primary-elsewhere", "old-primary-returns", "primary-is-me", "majority", "bad-replies"],
)
def test_the_role_the_sentinels_give_decides(
    tmp_path: Path, server: tuple[str, str], answers: dict[int, str], expected: str
) -> None:
    name, options = server
    done = start_server(tmp_path, answers, *options.split(), REDIS_NAME=name, REDIS_SENTINELS=SENTINELS)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected
    assert "start-server:" in done.stderr, "it says which role it took and why"


def test_without_a_name_it_refuses_to_start(tmp_path: Path) -> None:
    done = start_server(tmp_path, {}, "redis-server", REDIS_SENTINELS=SENTINELS)
    assert done.returncode != 0 and done.stdout == ""
    assert "REDIS_NAME must name this server" in done.stderr


async def test_the_killed_primary_comes_back_as_the_new_primarys_replica(tmp_path: Path) -> None:
    """On a real Sentinel topology: the primary SIGKILLed, the replica promoted and written to; the
    killed server started by the script on its port with its old data is a replica from the first
    reply it gives, and gets the write made after the failover."""
    async with SentinelTopology(aof=True, run_dir=tmp_path / "sentinel") as topology:
        killed = await topology.kill_primary()
        promoted = await topology.wait_promoted(killed)
        primary = RedisClient(f"redis://{promoted.host}:{promoted.port}/0", socket_timeout=5)
        try:
            await primary.execute("SET", "after-the-failover", "1")
        finally:
            await primary.aclose()
        cli_dir = Path(redis_server_binary()).parent  # redis-cli sits beside the server binary
        env = {
            "PATH": f"{cli_dir}:{os.environ['PATH']}",
            "REDIS_NAME": killed.host,
            "REDIS_PORT": str(killed.port),
            "REDIS_SENTINELS": " ".join(f"{s.host}:{s.port}" for s in topology.sentinels),
        }
        log = (tmp_path / "start-server.log").open("w")
        process = subprocess.Popen(  # noqa: ASYNC220 (started once; the test waits on Redis, not on it)
            [
                *("sh", str(SCRIPT), redis_server_binary(), "--port", str(killed.port), "--bind", killed.host),
                *("--dir", str(killed.data_dir), "--appendonly", "yes", "--save", "", "--protected-mode", "no"),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            client = RedisClient(f"redis://{killed.host}:{killed.port}/0", socket_timeout=5)
            try:
                first_role = [str(part) for part in await _answer(client, "ROLE")]
                assert first_role[0] == "slave" and int(first_role[2]) == promoted.port, first_role
                assert await _answer(client, "GET", "after-the-failover", accept=lambda r: r is not None) == "1"
            finally:
                await client.aclose()
        finally:
            process.kill()  # SIGTERM may be refused while the first AOF is written
            process.wait(timeout=10)
            log.close()
        assert "starting as its replica" in (tmp_path / "start-server.log").read_text()


async def _answer(
    client: RedisClient, *command: str, accept: Callable[[Any], bool] = lambda _: True, timeout: float = 20.0
) -> Any:
    """The first reply to `command` that `accept`s, asked again while the server is not up yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            reply = await client.execute(*command)
        except Exception:
            reply = None
        else:
            if accept(reply):
                return reply
        assert time.monotonic() < deadline, f"no accepted reply to {command} within {timeout:.0f} s (last: {reply!r})"
        await asyncio.sleep(0.05)
