"""A `switchboard up` run per test that asks for one, stopped (killed) if the test left it running."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.embedded import free_port
from tests.cli.support import Up


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    started = Up(free_port(), tmp_path / "run")
    try:
        yield started
    finally:
        if started.proc.poll() is None:
            started.kill()
