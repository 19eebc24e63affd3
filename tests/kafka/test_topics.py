"""apply_topics / check_topics on every enabled broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from pipeline.embedded import ApacheKafka, TansuBroker
from pipeline.kafka import Drift, TopicSpec, admin_client, apply_topics, check_topics, produce


async def test_apply_creates_then_no_drift(kafka_bootstrap: str, unique_name: Callable[..., str]) -> None:
    specs = [
        TopicSpec(unique_name("a"), partitions=3, config={"retention.ms": "3600000"}),
        TopicSpec(unique_name("b"), partitions=1, config={"cleanup.policy": "compact"}),
    ]
    before = await check_topics(kafka_bootstrap, specs)
    assert {(d.topic, d.kind) for d in before} == {(s.name, "missing") for s in specs}

    report = await apply_topics(kafka_bootstrap, specs)
    assert report.ok, report.summary()
    assert sorted(report.created) == sorted(s.name for s in specs)
    assert await check_topics(kafka_bootstrap, specs) == []

    again = await apply_topics(kafka_bootstrap, specs)
    assert again.created == [] and sorted(again.unchanged) == sorted(s.name for s in specs)


async def test_check_never_creates(kafka_bootstrap: str, unique_name: Callable[..., str]) -> None:
    spec = TopicSpec(unique_name("ghost"), partitions=2)
    assert [d.kind for d in await check_topics(kafka_bootstrap, [spec])] == ["missing"]
    async with admin_client(kafka_bootstrap) as admin:
        assert spec.name not in await admin.list_topics()


async def test_partition_drift(
    kafka_broker: TansuBroker | ApacheKafka, kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    name = unique_name("parts")
    await apply_topics(kafka_bootstrap, [TopicSpec(name, partitions=1)])
    wider = TopicSpec(name, partitions=3)
    assert await check_topics(kafka_bootstrap, [wider]) == [Drift(name, "partitions", 3, 1)]

    report = await apply_topics(kafka_bootstrap, [wider])
    assert report.ok, report.summary()
    if kafka_broker.supports_create_partitions:
        assert report.partitions_increased == {name: (1, 3)}
        assert await check_topics(kafka_bootstrap, [wider]) == []
    else:  # Tansu: reported, not raised, and the drift stays visible
        assert report.partitions_increased == {}
        assert any("cannot add partitions" in m for m in report.degraded), report.summary()
        assert await check_topics(kafka_bootstrap, [wider]) == [Drift(name, "partitions", 3, 1)]


async def test_fewer_partitions_is_degraded(kafka_bootstrap: str, unique_name: Callable[..., str]) -> None:
    name = unique_name("shrink")
    await apply_topics(kafka_bootstrap, [TopicSpec(name, partitions=2)])
    report = await apply_topics(kafka_bootstrap, [TopicSpec(name, partitions=1)])
    assert report.ok
    assert any("cannot remove partitions" in m for m in report.degraded)
    assert [d.kind for d in await check_topics(kafka_bootstrap, [TopicSpec(name, partitions=1)])] == ["partitions"]


async def test_config_drift(
    kafka_broker: TansuBroker | ApacheKafka, kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    name = unique_name("cfg")
    base = TopicSpec(name, partitions=1, config={"retention.ms": "3600000", "segment.ms": "600000"})
    await apply_topics(kafka_bootstrap, [base])
    changed = TopicSpec(name, partitions=1, config={"retention.ms": "7200000", "segment.ms": "600000"})
    drift = await check_topics(kafka_bootstrap, [changed])
    assert drift == [Drift(name, "config", "7200000", "3600000", key="retention.ms")]
    assert "retention.ms" in str(drift[0])

    report = await apply_topics(kafka_bootstrap, [changed])
    assert report.ok, report.summary()
    if kafka_broker.supports_alter_configs:
        assert report.configs_altered == {name: {"retention.ms": "7200000"}}
        # the untouched override (segment.ms) survived the non-incremental AlterConfigs
        assert await check_topics(kafka_bootstrap, [changed]) == []
    else:
        assert any("cannot alter topic configs" in m for m in report.degraded), report.summary()
        assert await check_topics(kafka_bootstrap, [changed]) == drift


async def test_replication_factor_capped_to_brokers(kafka_bootstrap: str, unique_name: Callable[..., str]) -> None:
    spec = TopicSpec(unique_name("rf"), partitions=1, replication_factor=3)
    report = await apply_topics(kafka_bootstrap, [spec])
    assert report.ok, report.summary()
    assert any("replication_factor 3" in w for w in report.warnings)
    assert await check_topics(kafka_bootstrap, [spec]) == []


async def test_without_the_cap_too_few_brokers_is_refused(
    kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    """A real cluster's apply: a topic the registered brokers cannot replicate as asked is not
    created with fewer replicas (it would keep them); the others are created."""
    short, fine = TopicSpec(unique_name("rf3"), replication_factor=3), TopicSpec(unique_name("rf1"))
    report = await apply_topics(kafka_bootstrap, [short, fine], cap_replication_factor=False, brokers_timeout=0.5)
    assert not report.ok and report.brokers == 1
    assert report.errors == {
        short.name: "not created: replication factor 3 needs 3 brokers, 1 registered after waiting 0.5 s"
    }
    assert report.created == [fine.name]
    assert await check_topics(kafka_bootstrap, [short, fine]) == [Drift(short.name, "missing", 1, None)]


async def test_min_insync_replicas_capped_to_the_replicas_a_topic_gets(
    kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    """The production spec (3 replicas, 2 in sync) on one broker: created with 1 of each, so an
    acks=all write still succeeds (2 in-sync replicas of 1 would refuse every write)."""
    spec = TopicSpec(unique_name("isr"), partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    report = await apply_topics(kafka_bootstrap, [spec])
    assert report.ok, report.summary()
    assert any("min.insync.replicas 2 > 1 replica(s)" in w for w in report.warnings), report.summary()
    assert await check_topics(kafka_bootstrap, [spec]) == []
    written = await produce(kafka_bootstrap, spec.name, "k", b"v")
    assert written.offset == 0


async def test_invalid_config_rejected_by_kafka(
    kafka_broker: TansuBroker | ApacheKafka, kafka_bootstrap: str, unique_name: Callable[..., str]
) -> None:
    spec = TopicSpec(unique_name("bad"), config={"no.such.config": "1"})
    report = await apply_topics(kafka_bootstrap, [spec])
    if kafka_broker.kind == "kafka":
        assert not report.ok and spec.name in report.errors
    else:  # Tansu accepts unknown configs silently
        assert report.ok


def test_spec_validation() -> None:
    with pytest.raises(ValueError):
        TopicSpec("bad name")
    with pytest.raises(ValueError):
        TopicSpec("t", partitions=0)
    with pytest.raises(ValueError):
        TopicSpec("t", config={"retention.ms": 5})  # type: ignore[dict-item]
    spec = TopicSpec.from_mapping({"name": "im.inbound", "partitions": 6, "config": {"retention.ms": 1000, "x": True}})
    assert spec.config == {"retention.ms": "1000", "x": "true"}


async def test_duplicate_specs_rejected(kafka_bootstrap: str) -> None:
    with pytest.raises(ValueError, match="duplicate"):
        await check_topics(kafka_bootstrap, [TopicSpec("dup"), TopicSpec("dup")])
