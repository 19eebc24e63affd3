"""The public API of faust, mode and aiokafka that Switchboard's Kafka driver relies on, checked
against the installed versions: a release that renames or drops one of these fails here, not in a
running worker. And the driver touches no private member of theirs (ruff's SLF001 checks the
accesses; this checks that no private method is overridden either)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import aiokafka
import aiokafka.errors
import faust
import faust.exceptions
import faust.transport.base
import faust.transport.drivers.aiokafka
import faust.types
import faust.types.transports
import mode
import pytest
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.partitioner import DefaultPartitioner, murmur2

from pipeline.settings import Settings
from pipeline.worker import driver, offsets
from pipeline.worker.app import SwitchboardApp, create_app
from pipeline.worker.driver import Fetcher, Producer, SwitchboardConsumer, Transport

# Each method the driver calls, with the parameters it passes by name.
AIOKAFKA_CONSUMER: dict[str, tuple[str, ...]] = {
    "start": (),
    "stop": (),
    "subscribe": ("topics", "listener"),
    "getmany": ("timeout_ms",),
    "commit": ("offsets",),
    "committed": ("partition",),
    "seek": ("partition", "offset"),
    "seek_to_beginning": (),
    "position": ("partition",),
    "highwater": ("partition",),
    "assignment": (),
    "pause": (),
    "resume": (),
    "beginning_offsets": ("partitions",),
    "end_offsets": ("partitions",),
    "partitions_for_topic": ("topic",),
}
AIOKAFKA_PRODUCER: dict[str, tuple[str, ...]] = {
    "start": (),
    "stop": (),
    "send": ("topic", "value", "key", "partition", "timestamp_ms", "headers"),
    "flush": (),
}
MODE_SERVICE: dict[str, tuple[str, ...]] = {
    "sleep": ("n",),
    "wait_first": ("timeout",),
    "itertimer": ("interval", "name"),
    "on_start": (),
    "on_stop": (),
}
# What the driver calls or reads on Faust's app.
FAUST_APP = (
    "on_rebalance_start",
    "on_rebalance_return",
    "on_rebalance_end",
    "consumer_generation_id",
    "in_transaction",
    "producer",
    "consumer",
    "conf",
    "should_stop",
)
# Faust settings the driver reads.
FAUST_SETTINGS = (
    "id",
    "broker_client_id",
    "consumer_group_instance_id",
    "consumer_auto_offset_reset",
    "broker_max_poll_interval",
    "consumer_max_fetch_size",
    "broker_request_timeout",
    "broker_check_crcs",
    "broker_session_timeout",
    "broker_rebalance_timeout",
    "broker_heartbeat_interval",
    "consumer_metadata_max_age_ms",
    "consumer_connections_max_idle_ms",
    "broker_credentials",
    "ssl_context",
    "broker_commit_interval",
    "broker_commit_every",
    "ConsumerScheduler",
    "producer_metadata_max_age_ms",
    "producer_connections_max_idle_ms",
)
# Faust's public producer attributes (set by its base `Producer`) the driver builds aiokafka's from.
FAUST_PRODUCER = (
    "client_id",
    "linger_ms",
    "max_batch_size",
    "max_request_size",
    "compression_type",
    "request_timeout",
    "partitioner",
    "buffer",
)


def has_parameters(function: Any, names: tuple[str, ...]) -> bool:
    parameters = inspect.signature(function).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    return all(name in parameters or takes_any for name in names)


@pytest.mark.parametrize(
    ("cls", "methods"),
    [
        (aiokafka.AIOKafkaConsumer, AIOKAFKA_CONSUMER),
        (aiokafka.AIOKafkaProducer, AIOKAFKA_PRODUCER),
        (mode.Service, MODE_SERVICE),
    ],
)
def test_the_client_methods_the_driver_calls_are_public(cls: type, methods: dict[str, tuple[str, ...]]) -> None:
    for name, parameters in methods.items():
        assert not name.startswith("_")
        method = getattr(cls, name)
        assert callable(method), name
        assert has_parameters(method, parameters), (cls.__name__, name, parameters)


def test_the_names_the_driver_imports_are_public() -> None:
    for module, names in [
        (aiokafka, aiokafka.__all__),
        (aiokafka.errors, ("CommitFailedError", "ConsumerStoppedError", "IllegalStateError", "KafkaError")),
        (faust.exceptions, ("ConsumerNotStarted", "ProducerSendError")),
        (faust.transport.base, faust.transport.base.__all__),
        (faust.types.transports, faust.types.transports.__all__),
    ]:
        for name in names:
            assert not name.startswith("_") and hasattr(module, name), (module.__name__, name)
    assert {"AIOKafkaConsumer", "AIOKafkaProducer", "ConsumerRebalanceListener", "TopicPartition"} <= set(
        aiokafka.__all__
    )
    assert {"Producer", "Transport"} <= set(faust.transport.base.__all__)
    assert {"ConsumerT", "ProducerT", "TransportT"} <= set(faust.types.transports.__all__)
    # Module-level functions of Faust's aiokafka driver (not in its __all__, not underscored).
    assert has_parameters(faust.transport.drivers.aiokafka.server_list, ("urls", "default_port"))
    assert has_parameters(faust.transport.drivers.aiokafka.credentials_to_aiokafka_auth, ("credentials", "ssl_context"))
    assert callable(RangePartitionAssignor) and callable(DefaultPartitioner()) and callable(murmur2)
    listener = aiokafka.ConsumerRebalanceListener
    assert {"on_partitions_revoked", "on_partitions_assigned"} <= set(listener.__abstractmethods__)
    assert has_parameters(
        faust.types.Message,
        ("topic", "partition", "offset", "timestamp", "timestamp_type", "headers", "key", "value", "checksum"),
    )
    assert has_parameters(faust.types.Message, ("serialized_key_size", "serialized_value_size", "tp", "generation_id"))
    assert "acked" in faust.types.Message.__slots__


def test_the_transport_plugs_in_through_fausts_public_class_attributes() -> None:
    base = faust.transport.base.Transport
    for name in ("Consumer", "Producer", "Fetcher", "create_consumer", "create_producer", "create_transaction_manager"):
        assert hasattr(base, name), name
    assert Transport.Consumer is SwitchboardConsumer
    assert Transport.Producer is Producer
    assert Transport.Fetcher is Fetcher
    assert faust.transport.by_url("switchboard://") is Transport  # the entry point
    # Every abstract method of Faust's interfaces is implemented.
    assert issubclass(SwitchboardConsumer, faust.types.transports.ConsumerT)
    assert not SwitchboardConsumer.__abstractmethods__
    assert issubclass(Producer, faust.types.transports.ProducerT)
    assert not Producer.__abstractmethods__


def worker_app() -> SwitchboardApp:
    settings = Settings(kafka_bootstrap="127.0.0.1:1", redis_url="redis://127.0.0.1:1/0")
    return create_app(settings, stages=["ingest"], platforms=[])


async def test_the_app_side_and_the_clients_take_what_the_driver_gives_them() -> None:
    app = worker_app()
    for name in FAUST_APP:
        assert hasattr(app, name), name
    for name in FAUST_SETTINGS:
        assert hasattr(app.conf, name), name
    consumer = app.consumer
    assert isinstance(consumer, SwitchboardConsumer)
    # Faust's app passes its assignment callback the rebalance's generation too.
    assert len(inspect.signature(consumer.assigned_callback).parameters) == 2
    assert len(inspect.signature(consumer.revoked_callback).parameters) == 1
    producer = app.producer
    assert isinstance(producer, Producer)
    for name in FAUST_PRODUCER:
        assert hasattr(producer, name), name
    # aiokafka accepts every setting the driver builds its clients with (built, never started).
    kafka_consumer = consumer.new_kafka_consumer()
    await kafka_consumer.stop()
    kafka_producer = aiokafka.AIOKafkaProducer(**producer.aiokafka_settings())
    await kafka_producer.stop()


def driver_sources() -> dict[str, ast.Module]:
    return {Path(m.__file__ or "").name: ast.parse(Path(m.__file__ or "").read_text()) for m in (driver, offsets)}


def test_the_driver_reads_no_private_member_of_another_object() -> None:
    for name, tree in driver_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value
                assert isinstance(owner, ast.Name) and owner.id in {"self", "cls"}, (name, node.lineno, node.attr)


def test_the_driver_overrides_no_private_member_of_faust_mode_or_aiokafka() -> None:
    checked = set()
    for name, tree in driver_sources().items():
        module = driver if name == "driver.py" else offsets
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(module, node.name)
            theirs = [b for b in cls.__mro__[1:] if b.__module__.split(".")[0] in {"faust", "mode", "aiokafka"}]
            defined = {n.name for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
            defined |= {
                t.id for n in node.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
            }
            defined |= {
                n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            }
            for member in defined:
                if member.startswith("_") and not member.startswith("__"):
                    overridden = [b.__qualname__ for b in theirs if hasattr(b, member)]
                    assert not overridden, (node.name, member, overridden)
            checked.add(node.name)
    assert {"SwitchboardConsumer", "Fetcher", "Producer", "Transport", "_RebalanceListener"} <= checked
