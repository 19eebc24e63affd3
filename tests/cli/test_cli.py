"""The `switchboard` command: help, topics apply/check, and settings problems reported before
anything starts (each naming the variable or the bots-file entry, all of them at once)."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cli import build_parser
from pipeline.embedded import RedisServer, TansuBroker, free_port
from pipeline.platforms import known_platforms
from pipeline.stack import SIM_API_KEY, SIM_OPENAPI_AK, SimProcess
from tests.cli.support import run, worker_env


def test_no_arguments_prints_help() -> None:
    result = run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: switchboard")
    for command in ("up", "worker", "sim", "topics", "bench"):
        assert f"    {command} " in result.stdout, f"{command} missing from:\n{result.stdout}"


def test_every_option_and_argument_has_help() -> None:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    undocumented = [
        f"{name} {action.dest}"
        for name, sub in subparsers.choices.items()
        for action in sub._actions  # noqa: SLF001
        if not isinstance(action, argparse._HelpAction) and not action.help  # noqa: SLF001
    ]
    assert not undocumented
    assert all(choice.help for choice in subparsers._choices_actions), "every command has a one-line help"  # noqa: SLF001


def test_version() -> None:
    from importlib.metadata import version

    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"switchboard {version('switchboard')}"


def test_every_sim_option_has_a_description() -> None:
    from pipeline.sim.cli import build_parser as sim_parser

    parser = sim_parser()
    undocumented = [a.dest for a in parser._actions if not isinstance(a, argparse._HelpAction) and not a.help]  # noqa: SLF001
    assert not undocumented
    help_text = run("sim", "--help").stdout
    for option in ("--ping-interval", "--latency-ms", "--host", "--drop-stream-prob"):
        assert option in help_text, help_text


def test_command_help_explains_the_options() -> None:
    up = run("up", "--help").stdout
    assert "--web-port PORT" in up and "SWITCHBOARD_WEB_PORT" in up
    worker = run("worker", "--help").stdout
    assert "--stages" in worker and "ingest,dispatch,render,egress" in worker
    topics = run("topics", "--help").stdout
    for action, words in (("apply", "create missing topics"), ("check", "drift"), ("schemas", "JSON Schemas")):
        line = next(line for line in topics.splitlines() if line.strip().startswith(action + "  "))
        assert words in line, line


def test_topics_check_reports_drift_until_apply(tansu_broker: TansuBroker) -> None:
    env = {
        "SWITCHBOARD_KAFKA_BOOTSTRAP": tansu_broker.bootstrap,
        "SWITCHBOARD_PARTITIONS": "3",
        "SWITCHBOARD_REPLICATION_FACTOR": "1",
    }
    before = run("topics", "check", env=env)
    assert before.returncode == 1, before.stdout + before.stderr
    assert "missing" in before.stdout
    applied = run("topics", "apply", env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    # A summary for a person: a headline of counts, then one line per topic.
    headline, *lines = applied.stdout.splitlines()
    assert headline.startswith(f"topics on {tansu_broker.bootstrap}, 1 broker(s): "), headline
    assert "created" in headline and "0 failed" in headline, headline
    assert "  created      im.inbound" in lines, applied.stdout
    assert "ApplyReport(" not in applied.stdout
    after = run("topics", "check", env=env)
    assert after.returncode == 0, after.stdout + after.stderr
    assert "no drift" in after.stdout
    again = run("topics", "apply", env=env)
    assert again.returncode == 0 and "0 created" in again.stdout and "  unchanged    im.inbound" in again.stdout


def test_topics_apply_refuses_fewer_replicas_than_asked(tmp_path: Path) -> None:
    """A replication factor the registered brokers cannot give: apply waits (bounded), then creates
    nothing with fewer replicas, exits non-zero and says what to do."""
    with TansuBroker(run_dir=tmp_path / "broker") as broker:  # one of its own: no topic exists yet
        env = {
            "SWITCHBOARD_KAFKA_BOOTSTRAP": broker.bootstrap,
            "SWITCHBOARD_PARTITIONS": "2",
            "SWITCHBOARD_REPLICATION_FACTOR": "2",
        }
        result = run("topics", "apply", "--brokers-timeout", "1", env=env)
        check = run("topics", "check", env=env)
    assert "im.inbound: topic is missing" in check.stdout, "nothing was created with fewer replicas"
    assert result.returncode == 1, result.stdout + result.stderr
    assert "failed" in result.stdout.splitlines()[0], result.stdout
    failed = [line for line in result.stdout.splitlines() if line.startswith("  FAILED")]
    assert failed and all(
        "not created: replication factor 2 needs 2 brokers, 1 registered after waiting 1 s" in line for line in failed
    ), result.stdout
    assert "SWITCHBOARD_REPLICATION_FACTOR (now 2)" in result.stderr, result.stderr
    assert "--brokers-timeout" in result.stderr


def test_bad_setting_is_named_by_its_variable() -> None:
    result = run("worker", env={"SWITCHBOARD_PARTITIONS": "0", "SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1"})
    assert result.returncode == 2
    assert "SWITCHBOARD_PARTITIONS=0: Input should be greater than or equal to 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_secret_values_are_not_echoed() -> None:
    result = run("worker", env={"SWITCHBOARD_SESSION_API_KEY": "k" * 20, "SWITCHBOARD_SESSION_PROFILE": "nope"})
    assert result.returncode == 2
    assert "SWITCHBOARD_SESSION_PROFILE=nope" in result.stderr
    assert "k" * 20 not in result.stderr


def test_worker_with_nothing_set_lists_every_missing_variable() -> None:
    result = run("worker")
    assert result.returncode == 2
    for name in (
        "SWITCHBOARD_KAFKA_BOOTSTRAP",
        "SWITCHBOARD_REDIS_URL",
        "SWITCHBOARD_SESSION_BASE_URL",
        "SWITCHBOARD_SESSION_API_KEY",
    ):
        assert f"{name} is not set" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_provisioner_credentials_are_required_up_front() -> None:
    result = run("worker", env={"SWITCHBOARD_SESSION_PROVISIONER": "ark-openapi"})
    assert result.returncode == 2
    assert "SWITCHBOARD_ARK_ACCESS_KEY is not set" in result.stderr
    assert "SWITCHBOARD_ARK_SECRET_KEY is not set" in result.stderr


def test_topics_needs_only_the_bootstrap() -> None:
    result = run("topics", "apply")
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if line.startswith("  ")]
    assert problems == [
        "  SWITCHBOARD_KAFKA_BOOTSTRAP is not set (the Kafka bootstrap servers, e.g. kafka-1:9092,kafka-2:9092)"
    ]


BAD_BOTS = """
[[bots]]
platform = "console"
bot_id = "demo"

[[bots]]
platform = "myspace"
bot_id = "wa"

[[bots]]
platform = "slack"
bot_id = "support"
credentials = { bot_token = "xoxb-1" }

[[bots]]
platform = "telegram"
bot_id = "has space"
credentials = { webhook_secret = "s" }

[[bots]]
platform = "lark"
bot_id = "lk"
credentials = { app_id = "cli_1", app_secret = "" }
"""

EXPECTED_BOT_PROBLEMS = [
    f"bots[1].platform: unknown platform 'myspace'; known: {', '.join(known_platforms())}",
    "bots[2].credentials.signing_secret: required for slack webhook (bot 'support')",
    "bots[3].bot_id: String should match pattern",
    "bots[3].credentials.token: required for telegram (bot 'has space')",
    "bots[4].credentials.app_secret: required for lark (bot 'lk')",
    "bots[4].credentials: verification_token or encrypt_key is required for lark (bot 'lk')",
]


@pytest.mark.parametrize("command", ["up", "worker"])
def test_bad_bots_file_lists_every_problem_before_anything_starts(command: str, tmp_path: Path) -> None:
    config = tmp_path / "bots.toml"
    config.write_text(BAD_BOTS)
    env = {"SWITCHBOARD_CONFIG": str(config)}
    if command == "worker":
        env |= worker_env("127.0.0.1:1", "redis://127.0.0.1:1/0", free_port())
    result = run(command, "--run-dir", str(tmp_path / "run"), env=env) if command == "up" else run(command, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    problems = [line.strip() for line in result.stderr.splitlines()[1:]]
    assert len(problems) == len(EXPECTED_BOT_PROBLEMS), result.stderr
    for line, expected in zip(problems, EXPECTED_BOT_PROBLEMS, strict=True):
        assert line.startswith(f"{config}: {expected}"), (line, expected)
    assert "starting" not in result.stdout
    assert not (tmp_path / "run").exists(), "nothing may start"


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('[[bots]]\nplatform = "console"\nbot_id = "a"\n' * 2, ": bot console/a is configured twice"),
        ("[[bots]\n", ": Expected ']]' at the end of an array declaration"),  # not TOML
    ],
    ids=["duplicate-bot", "not-toml"],
)
def test_whole_file_problems_name_the_file(content: str, expected: str, tmp_path: Path) -> None:
    config = tmp_path / "bots.toml"
    config.write_text(content)
    result = run("up", env={"SWITCHBOARD_CONFIG": str(config)})
    assert result.returncode == 2
    assert f"SWITCHBOARD_CONFIG={config}{expected}" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def _one_line(result: object) -> str:
    stderr: str = result.stderr  # type: ignore[attr-defined]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_unreachable_kafka_is_one_line(redis_server: RedisServer) -> None:
    dead = f"127.0.0.1:{free_port()}"
    result = run("worker", env=worker_env(dead, redis_server.url, free_port()))
    assert result.returncode == 1
    line = _one_line(result)
    assert line.startswith(f"switchboard: cannot reach Kafka at {dead} (SWITCHBOARD_KAFKA_BOOTSTRAP)"), line


def test_unresolvable_kafka_is_one_line(redis_server: RedisServer) -> None:
    result = run("worker", env=worker_env("kafka.invalid:9092", redis_server.url, free_port()))
    assert result.returncode == 1
    assert "cannot resolve kafka.invalid" in _one_line(result)


def test_topics_with_unreachable_kafka_is_one_line() -> None:
    dead = f"127.0.0.1:{free_port()}"
    result = run("topics", "apply", env={"SWITCHBOARD_KAFKA_BOOTSTRAP": dead})
    assert result.returncode == 1
    assert "SWITCHBOARD_KAFKA_BOOTSTRAP" in _one_line(result)


def test_unreachable_redis_is_one_line_without_its_password(tansu_broker: TansuBroker) -> None:
    port = free_port()
    url = f"redis://:hunter2-not-shown@127.0.0.1:{port}/0"
    result = run("worker", env=worker_env(tansu_broker.bootstrap, url, free_port()))
    assert result.returncode == 1
    line = _one_line(result)
    assert line.startswith(f"switchboard: cannot reach Redis at 127.0.0.1:{port}/0 (SWITCHBOARD_REDIS_URL)"), line
    assert "hunter2" not in line


def test_redis_refusing_the_password_is_one_line(tansu_broker: TansuBroker, redis_server: RedisServer) -> None:
    url = f"redis://someone:wrong-password@127.0.0.1:{redis_server.port}/0"  # no such user on the test server
    result = run("worker", env=worker_env(tansu_broker.bootstrap, url, free_port()))
    assert result.returncode == 1
    line = _one_line(result)
    assert "(SWITCHBOARD_REDIS_URL) refused the connection" in line and "wrong-password" not in line


def test_up_checks_a_given_kafka_before_starting_anything(tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"
    env = {"SWITCHBOARD_KAFKA_BOOTSTRAP": dead}
    result = run("up", "--web-port", str(free_port()), "--run-dir", str(tmp_path / "run"), env=env)
    assert result.returncode == 1
    assert "SWITCHBOARD_KAFKA_BOOTSTRAP" in _one_line(result)
    assert not (tmp_path / "run").exists()


def test_unknown_stage_or_platform_is_named() -> None:
    result = run("worker", "--stages", "ingest,rendr", "--platforms", "myspace")
    assert result.returncode == 2
    assert "--stages: unknown stage 'rendr'" in result.stderr
    assert "--platforms: unknown platform 'myspace'" in result.stderr


def test_a_broker_without_idempotent_producers_is_one_line(
    tansu_broker: TansuBroker, redis_server: RedisServer
) -> None:
    """Tansu has no InitProducerId: with idempotence on (the default) the worker stops before it
    starts, with one line naming the setting, not aiokafka's bare UnknownError."""
    env = worker_env(tansu_broker.bootstrap, redis_server.url_for_db(7), free_port())
    env["SWITCHBOARD_KAFKA_IDEMPOTENCE"] = "true"
    result = run("worker", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"switchboard: the broker at {tansu_broker.bootstrap} does not support idempotent producers "
        "(InitProducerId: UnknownError): set SWITCHBOARD_KAFKA_IDEMPOTENCE=false (a write the producer "
        "retries after a broker failure may then be stored twice; the embedded Tansu broker is such a broker)"
    ]


# -- the session settings as a whole -------------------------------------------------------------------

ARK_API = {"SWITCHBOARD_SESSION_BASE_URL": "http://127.0.0.1:9/api/v3", "SWITCHBOARD_SESSION_API_KEY": "k"}


def _problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    assert result.returncode == 2, result.stdout + result.stderr
    return [line.strip() for line in result.stderr.splitlines() if line.startswith("  ")]


def test_an_ark_url_and_key_alone_say_everything_sessions_need() -> None:
    """The defaults are consistent (Ark's sessions are created through Volcengine OpenAPI), and
    everything that provisioner needs is listed at once, the agent id included."""
    problems = _problems(run("worker", env=ARK_API))
    for name in ("SWITCHBOARD_ARK_ACCESS_KEY", "SWITCHBOARD_ARK_SECRET_KEY", "SWITCHBOARD_SESSION_AGENT_ID"):
        assert any(p.startswith(f"{name} is not set") for p in problems), problems
    assert not any("PROVISIONER" in p for p in problems), "no contradiction in the defaults"


def test_a_provisioner_the_profile_cannot_use_is_named_with_what_else_is_missing() -> None:
    env = {**ARK_API, "SWITCHBOARD_SESSION_PROVISIONER": "anthropic"}
    problems = _problems(run("worker", env=env))
    assert any(
        p.startswith("SWITCHBOARD_SESSION_PROFILE=ark with SWITCHBOARD_SESSION_PROVISIONER=anthropic: Ark does not")
        for p in problems
    ), problems
    assert any(p.startswith("SWITCHBOARD_SESSION_AGENT_ID is not set") for p in problems), problems
    assert any(p.startswith("SWITCHBOARD_SESSION_ENVIRONMENT_ID is not set") for p in problems), problems


def test_up_with_a_session_api_of_your_own_checks_it_too(tmp_path: Path) -> None:
    problems = _problems(run("up", "--run-dir", str(tmp_path / "run"), env=ARK_API))
    assert any(p.startswith("SWITCHBOARD_SESSION_AGENT_ID is not set") for p in problems), problems
    assert not (tmp_path / "run").exists()


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProcess]:
    with SimProcess(free_port(), run_dir=tmp_path / "sim") as server:
        yield server


def test_a_key_the_session_api_refuses_stops_the_worker_before_it_starts(
    tansu_broker: TansuBroker, redis_server: RedisServer, sim: SimProcess
) -> None:
    """One real, cheap call with the configured key (a lookup of a session nobody has)."""
    env = worker_env(tansu_broker.bootstrap, redis_server.url_for_db(7), free_port())
    env |= {"SWITCHBOARD_SESSION_BASE_URL": f"{sim.url}/api/v3", "SWITCHBOARD_SESSION_API_KEY": "not-the-key"}
    result = run("worker", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"switchboard: the session API at {sim.url}/api/v3 (SWITCHBOARD_SESSION_BASE_URL) refused "
        "SWITCHBOARD_SESSION_API_KEY (401)"
    ]


def test_control_plane_keys_the_endpoint_refuses_stop_the_worker_before_it_starts(
    tansu_broker: TansuBroker, redis_server: RedisServer, sim: SimProcess
) -> None:
    """The ark-openapi provisioner: one signed call that changes nothing (deleting a session nobody
    has) tells keys Volcengine OpenAPI accepts from keys it refuses."""
    env = worker_env(tansu_broker.bootstrap, redis_server.url_for_db(7), free_port())
    env |= {
        "SWITCHBOARD_SESSION_BASE_URL": f"{sim.url}/api/v3",
        "SWITCHBOARD_SESSION_API_KEY": SIM_API_KEY,
        "SWITCHBOARD_SESSION_PROVISIONER": "ark-openapi",
        "SWITCHBOARD_SESSION_AGENT_ID": "agent-1",
        "SWITCHBOARD_ARK_OPENAPI_URL": sim.url,
        "SWITCHBOARD_ARK_ACCESS_KEY": SIM_OPENAPI_AK,
        "SWITCHBOARD_ARK_SECRET_KEY": "not-the-secret-key",
    }
    result = run("worker", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [
        f"switchboard: Volcengine OpenAPI at {sim.url} refused SWITCHBOARD_ARK_ACCESS_KEY / "
        "SWITCHBOARD_ARK_SECRET_KEY (401): sessions could not be created"
    ]
