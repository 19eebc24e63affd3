"""constraints.txt pins what make, CI and the Docker image install: every runtime dependency, at
the versions this environment (where the suite runs) has."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pins() -> dict[str, str]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not pinned with =="
            found[_normal(name)] = version
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_dependencies() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [_normal(re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0]) for spec in project["dependencies"]]


def test_every_runtime_dependency_is_pinned() -> None:
    missing = [name for name in runtime_dependencies() if name not in pins()]
    assert not missing, f"pin these in constraints.txt: {missing}"


def test_the_pins_are_the_versions_the_suite_runs_with() -> None:
    drift = {
        name: (version, metadata.version(name))
        for name, version in pins().items()
        if _installed(name) and metadata.version(name) != version
    }
    assert not drift, f"constraints.txt (pinned, installed) differ: {drift}; regenerate it or reinstall"


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        return False
    return True
