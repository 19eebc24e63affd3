"""How the worker's app wires its stages together."""

from __future__ import annotations

from pipeline.settings import Settings
from pipeline.worker.app import create_app


def test_render_hands_its_flushes_to_dispatch_only_where_both_run() -> None:
    """A flush is started in place only by a worker that runs dispatch as well as render; a worker
    of render alone leaves it to the flush record."""
    settings = Settings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0")
    both = create_app(settings, platforms=[]).switchboard_runtime  # type: ignore[attr-defined]
    assert both.flush_now is not None
    alone = create_app(settings, stages=["render"], platforms=[]).switchboard_runtime  # type: ignore[attr-defined]
    assert alone.flush_now is None
