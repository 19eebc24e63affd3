"""The worker image's Dockerfile, checked statically: sources exist, non-root, health-checked."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests.deploy.support import DOCKERFILE, ROOT, bad_setting_names

Instruction = tuple[str, str]


def instructions() -> list[Instruction]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "dangling line continuation"
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[Instruction]]:
    result: list[list[Instruction]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        assert result, "the first instruction must be FROM"
        result[-1].append(ins)
    return result


@pytest.fixture(scope="module")
def final() -> list[Instruction]:
    return stages()[-1]


def test_base_images_are_slim_and_pinned() -> None:
    for stage in stages():
        image = stage[0][1].split()[0]
        assert ":" in image and not image.endswith(":latest"), image
        assert "slim" in image or "alpine" in image, f"{image}: use a slim base"


def test_copy_sources_exist() -> None:
    names = {s[0][1].split()[-1] for s in stages() if " AS " in s[0][1].upper()}
    for word, args in instructions():
        if word not in ("COPY", "ADD"):
            continue
        parts = shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        sources = [p for p in parts if not p.startswith("--")][:-1]
        if any(f.startswith("--from=") for f in flags):
            assert any(f.split("=", 1)[1] in names for f in flags if f.startswith("--from=")), args
            continue
        for source in sources:
            assert (ROOT / source).exists(), f"{word} {args}: {source} does not exist"


def test_runs_as_a_non_root_user(final: list[Instruction]) -> None:
    users = [args for word, args in final if word == "USER"]
    assert users, "the final stage must set USER"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), user
    # Numeric, so Kubernetes' runAsNonRoot can verify it without /etc/passwd.
    assert user.isdigit(), f"USER {users[-1]}: use the numeric uid"
    created = re.search(r"useradd\b[^&]*--uid\s+(\d+)", " ".join(a for w, a in final if w == "RUN"))
    assert created and created.group(1) == user, "USER must be the uid created by useradd"


def test_has_a_healthcheck_on_healthz(final: list[Instruction]) -> None:
    checks = [args for word, args in final if word == "HEALTHCHECK"]
    assert len(checks) == 1
    assert "/healthz" in checks[0]
    command = json.loads(checks[0].split("CMD", 1)[1])  # exec form: no shell needed in the image
    assert command[0] == "python" and "/healthz" in command[-1]
    assert "SWITCHBOARD_WEB_PORT" in checks[0], "the check must follow the configured port"


def test_env_and_port(final: list[Instruction]) -> None:
    env: dict[str, str] = {}
    for word, args in final:
        if word == "ENV":
            env.update(dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", args)))
    assert not bad_setting_names(set(env)), "ENV sets names that are not Settings fields"
    assert env.get("SWITCHBOARD_WEB_HOST") == "0.0.0.0"
    exposed = {int(p.split("/")[0]) for word, args in final if word == "EXPOSE" for p in args.split()}
    assert exposed == {int(env["SWITCHBOARD_WEB_PORT"])}
    # Faust writes its data dir at start; it must be somewhere the user owns.
    assert env.get("FAUST_DATADIR", "").startswith("/app")
    assert any(w == "RUN" and "install -d -o" in a and "/app" in a for w, a in final)


def test_topic_catalogue_ships_with_the_package(final: list[Instruction]) -> None:
    """The catalogue is package data (pipeline/topics/): the image installs the package and nothing
    beside it, and checks at build time that the installed package can read it."""
    build = stages()[0]
    assert not any(w == "COPY" and a.split()[0] == "topics" for w, a in build), "topics/ is package data now"
    assert any(w == "RUN" and "pip install" in a and "cp " not in a for w, a in build)
    assert any(w == "RUN" and "from pipeline.topics import declarations" in a for w, a in final)


def test_entrypoint_is_the_cli(final: list[Instruction]) -> None:
    entry = [a for w, a in final if w == "ENTRYPOINT"]
    cmd = [a for w, a in final if w == "CMD"]
    assert entry and json.loads(entry[-1]) == ["switchboard"], "exec form, so SIGTERM reaches the worker"
    assert cmd and json.loads(cmd[-1]) == ["worker"]
