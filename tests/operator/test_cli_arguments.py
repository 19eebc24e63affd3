"""The operator commands' arguments and settings are checked before anything is reached."""

from __future__ import annotations

from tests.cli.support import run

REACHABLE_NOWHERE = {"SWITCHBOARD_KAFKA_BOOTSTRAP": "127.0.0.1:1", "SWITCHBOARD_REDIS_URL": "redis://127.0.0.1:1"}


def test_listed_in_the_help() -> None:
    result = run()
    assert "\n    deadletters" in result.stdout and "\n    conversation" in result.stdout, result.stdout


def test_mistaken_arguments_are_named_before_anything_is_reached() -> None:
    for args, words in (
        (["deadletters", "show"], "`show` needs one"),
        (["deadletters", "list", "0:1"], "a POSITION goes with `show` only"),
        (["deadletters", "list", "--since", "yesterday"], "--since/--until: 'yesterday' is neither a duration"),
        (["conversation", "--platform", "telegram", "--chat", "1"], "give --platform, --bot and --chat"),
    ):
        result = run(*args, env=REACHABLE_NOWHERE)
        assert result.returncode == 2 and words in result.stderr, (args, result.stderr)
        assert "cannot reach" not in result.stderr


def test_they_need_kafka_and_redis_only() -> None:
    result = run("conversation", "--session", "sesn-1")
    assert result.returncode == 2
    assert (
        "SWITCHBOARD_KAFKA_BOOTSTRAP is not set" in result.stderr
        and "SWITCHBOARD_REDIS_URL is not set" in result.stderr
    )
    assert "SESSION" not in result.stderr  # no session API settings: these commands never call it
    unreachable = run("deadletters", "list", env=REACHABLE_NOWHERE)
    assert unreachable.returncode == 1 and "cannot reach Kafka at 127.0.0.1:1" in unreachable.stderr
