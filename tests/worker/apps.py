"""A `SwitchboardApp` with no stages of its own, on the broker under test: the driver alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.worker.app import SwitchboardApp
from pipeline.worker.driver import ConsumerTuning, broker_url


def driver_app(name: str, broker: TansuBroker | ApacheKafka, datadir: Path, **options: Any) -> SwitchboardApp:
    """Raw keys and values, nothing declared, read from the start; `add_sink` gives it its topics."""
    return SwitchboardApp(
        name,
        consumer_tuning=ConsumerTuning(fetch_max_wait_ms=20),
        idempotent_producer=broker.supports_idempotence,
        broker=broker_url(broker.bootstrap),
        key_serializer="raw",
        value_serializer="raw",
        web_enabled=False,
        datadir=str(datadir),  # not Faust's default, the working directory
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        **options,
    )
