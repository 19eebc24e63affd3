"""The wheel on its own: built, installed without extras into a clean virtualenv (what the Docker
image and `pip install .` get), and `switchboard up` from it gives a first reply in the console.

A runtime import of a dev-only dependency, or a data file left out of the package (the topic
catalogue, the console page), fails here rather than in a deployment.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.timeout(900)]


def _clean_env() -> dict[str, str]:
    """No SWITCHBOARD_* settings, and nothing that would import the source tree instead of the wheel."""
    drop = ("SWITCHBOARD_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def _pip(python: Path, *args: str, cwd: Path) -> None:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", "-q", *args],
        cwd=cwd,
        env={**_clean_env(), "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _source_copy(target: Path) -> Path:
    """The files a fresh clone has (tracked, or new and not ignored): the wheel is built from them,
    and setuptools' build directory lands in the copy, not in the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a new virtualenv holding the wheel and its runtime dependencies only."""
    work = tmp_path_factory.mktemp("wheel")
    source = _source_copy(work / "src")
    _pip(Path(sys.executable), "wheel", "--no-deps", "-w", str(work / "dist"), str(source), cwd=work)
    wheels = list((work / "dist").glob("switchboard-*.whl"))
    assert len(wheels) == 1, wheels
    subprocess.run([sys.executable, "-m", "venv", str(work / "venv")], check=True, env=_clean_env(), timeout=120)
    python = work / "venv" / "bin" / "python"
    # As the Docker image installs it: the dependencies at the versions constraints.txt pins.
    _pip(python, "install", "-c", str(source / "constraints.txt"), str(wheels[0]), cwd=work)
    return python.parent


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_installed_without_extras_has_no_dev_dependencies(installed: Path, tmp_path: Path) -> None:
    probe = "import importlib.util as u; print([m for m in ('pytest', 'playwright', 'matplotlib') if u.find_spec(m)])"
    result = subprocess.run(
        [str(installed / "python"), "-c", probe], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True
    )
    assert result.stdout.strip() == "[]", "the test must run against a runtime-only install"
    where = subprocess.run(
        [str(installed / "python"), "-c", "import pipeline; print(pipeline.__file__)"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip().startswith(str(installed.parent)), "pipeline must come from the wheel"


def test_up_from_the_wheel_gives_a_first_reply(installed: Path, tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "up.out"
    with open(out, "wb") as handle:
        up = subprocess.Popen(
            [str(installed / "switchboard"), "up", "--web-port", str(port), "--run-dir", str(tmp_path / "run")],
            cwd=tmp_path,
            env=_clean_env(),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "switchboard is up" not in out.read_text():
            assert up.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
        banner = out.read_text()
        assert f"console      http://127.0.0.1:{port}/console/" in banner
        assert f"{tmp_path / 'run' / 'worker0' / 'worker.log'}" in banner

        body = {"chat_id": "wheel", "chat_type": "private", "user_id": "u1", "user_name": "U", "text": "hello wheel"}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/webhooks/console/demo",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
        deadline = time.monotonic() + 60
        texts: list[str] = []
        while not texts:
            assert time.monotonic() < deadline, out.read_text()
            page = _get_json(f"http://127.0.0.1:{port}/console/api/messages?chat_id=wheel")
            assert isinstance(page, dict)
            texts = [s["data"]["text"] for m in page["messages"] for s in m["segments"] if s["type"] == "text"]
            time.sleep(0.3)
        assert texts == ["echo: hello wheel"]
        while "console:demo:wheel: reply delivered" not in out.read_text():  # the terminal's turn line
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.3)
        # A first run with nothing set has nothing to warn about (it once warned of its own short keys).
        assert not [line for line in out.read_text().splitlines() if " WARNING " in line or " ERROR " in line]
        assert "hello wheel" not in out.read_text(), "no message bodies in the terminal"
    finally:
        os.killpg(up.pid, signal.SIGINT)  # Ctrl-C: `up` stops its parts in order
        try:
            code = up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
    assert code == 0, out.read_text()
    assert "stopped; logs kept in" in out.read_text()
