"""A replicated Apache Kafka cluster (3 KRaft nodes, topics with 3 replicas and 2 in sync) under
broker faults with real workers: the node leading the most partitions is SIGKILLed under load and
brought back, then every node is restarted in turn. Every accepted message is answered exactly
once and its user message posted to the session once.

Three JVMs, two workers, Redis and the simulator: about four minutes on the 2-core machine, so these
run with the other Apache Kafka tests (`SWITCHBOARD_TEST_BROKERS=tansu,kafka make test`), or alone:

    SWITCHBOARD_TEST_BROKERS=kafka .venv/bin/pytest -q tests/faults/test_kafka_cluster.py

The recovery figures (lag back to normal, leaders moved) come from the bench that runs the same
scenario: `switchboard bench --chaos --kafka-cluster 3 --chaos-kill leader,rolling` (bench/README.md).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.bench.chaos import ChaosConfig
from pipeline.bench.chaos_kafka import lag_recovery, parse_broker_faults
from pipeline.embedded import KafkaCluster
from pipeline.kafka import TopicSpec, admin_client, apply_topics, check_topics, describe_topic_states, produce
from pipeline.kafka.admin import metadata_of_each_node
from pipeline.settings import Settings
from pipeline.topics import IM_INBOUND, cluster_specs
from tests.conftest import enabled_brokers

from .chaos_run import assert_answered_exactly_once, run_chaos_for_test

needs_kafka = pytest.mark.skipif(
    "kafka" not in enabled_brokers(), reason="needs Apache Kafka (SWITCHBOARD_TEST_BROKERS=kafka)"
)


def test_lag_recovery_is_measured_from_the_fault_to_normal_lag() -> None:
    samples: list[tuple[float, int | None]] = [(t, 10) for t in range(10)]  # before: p95 10, normal <= 20
    samples += [(10, None), (11, 500), (12, 8), (13, 400)]  # a blip, a dip, another blip
    samples += [(t, 15) for t in range(14, 19)]  # 5 s within normal
    samples += [(19, 90), (20, 9)]  # a late blip, then normal until the next fault
    samples += [(30, 3), (31, 60), (32, 2)]  # the second fault's own blip
    windows = [{"start_s": 10.0}, {"start_s": 30.0}]
    normal = lag_recovery(samples, windows)
    assert normal["normal_lag_bound"] == 20
    assert windows[0]["lag_normal_again_s"] == 4  # 14 s: the first 5 samples in a row, not the dip at 12 s
    assert windows[0]["lag_recovered_s"] == 10  # 20 s: after the late blip at 19 s
    assert windows[0]["max_lag"] == 500 and windows[0]["unreadable_lag_samples"] == 1
    assert windows[1]["lag_recovered_s"] == 2 and windows[1]["lag_normal_again_s"] is None  # too few samples
    still_high = [{"start_s": 10.0}]
    lag_recovery([*samples[:10], (10, 99), (11, 99)], still_high)
    assert still_high[0]["lag_recovered_s"] is None  # never back: no figure, not a made-up one


def test_broker_fault_names_are_checked() -> None:
    assert parse_broker_faults("leader, rolling") == ("leader", "rolling")
    with pytest.raises(ValueError, match="unknown fault"):
        parse_broker_faults("leader,reboot")


@needs_kafka
@pytest.mark.integration
@pytest.mark.timeout(240)
async def test_production_topics_are_replicated_and_refuse_writes_below_two_in_sync(tmp_path: Path) -> None:
    """The settings' defaults give every topic 3 replicas and min.insync.replicas=2 on the cluster;
    with two of the three brokers' replicas gone, an acks=all write is refused, not half-stored."""
    async with KafkaCluster(3, run_dir=tmp_path / "kafka") as cluster:
        # Ready means every node's metadata lists all three: a node still listing two would create
        # the topics below with two replicas.
        assert await cluster.brokers_listed() == {1: 3, 2: 3, 3: 3}
        specs = cluster_specs(Settings(kafka_bootstrap=cluster.bootstrap, partitions=3))
        report = await apply_topics(cluster.bootstrap, specs)
        assert report.ok and not report.warnings, report.summary()
        # Applied means every node knows the topics, not only the one the create went through: a
        # check (or a producer) asking another node right after must not find them missing.
        names = sorted(s.name for s in specs)
        answers = await metadata_of_each_node(cluster.bootstrap, names)
        listed = {node: sorted(t["topic"] for t in m["topics"] if not t["error_code"]) for node, m in answers.items()}
        assert listed == {1: names, 2: names, 3: names}
        assert await check_topics(cluster.bootstrap, specs) == []
        async with admin_client(cluster.bootstrap) as admin:
            states = await describe_topic_states(admin, [s.name for s in specs])
        for spec in specs:
            assert states[spec.name].replication_factor == 3, spec.name
            assert states[spec.name].configs["min.insync.replicas"] == "2", spec.name
        # A topic on two nodes only: stop one of them and the other cannot meet min.insync.replicas.
        two = TopicSpec("two-replicas", partitions=1, replication_factor=2, config={"min.insync.replicas": "2"})
        assert (await apply_topics(cluster.bootstrap, [two])).ok
        [partition] = await cluster.partitions([two.name])
        await produce(cluster.bootstrap, two.name, "k", b"both in sync")
        follower = next(n for n in partition.replicas if n != partition.leader)
        await cluster.stop_node(follower)  # a controlled shutdown takes it out of the ISR at once
        [partition] = await cluster.partitions([two.name])
        assert partition.isr == (partition.leader,), partition
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap, enable_idempotence=True)
        await producer.start()
        try:
            # The leader answers NotEnoughReplicas (its log says so) and the producer retries.
            refused = asyncio.ensure_future(producer.send_and_wait(two.name, b"one in sync", key=b"k"))
            done, _ = await asyncio.wait({refused}, timeout=8)
            assert not done, "acknowledged with one replica in sync"
            # The pipeline's topics have 2 of their 3 replicas in sync: writable.
            await asyncio.wait_for(producer.send_and_wait(IM_INBOUND, b"two of three in sync", key=b"k"), 30)
            await cluster.start_node(follower)
            written = await asyncio.wait_for(refused, 60)  # stored once two replicas have it
            assert written.offset == 1
        finally:
            await producer.stop()


@needs_kafka
@pytest.mark.integration
@pytest.mark.timeout(480)
async def test_leader_killed_then_rolling_restart_every_message_answered_once(tmp_path: Path) -> None:
    cfg = ChaosConfig(
        duration=110,
        rate=8,
        chats=24,
        think=0.5,
        workers=2,
        kill_every=0,
        redis_restarts=0,
        drop_streams=0,
        api_faults=False,
        accept_delay=False,
        kill_in_accept_delay=False,
        onebot_rate=0.0,
        kafka_nodes=3,
        broker_faults=("leader", "rolling"),
        broker_faults_at=0.15,
        broker_down_for=10,
        settle_timeout=90,
        quiet=6,
        run_dir=tmp_path / "stack",
    )
    result, detail = await run_chaos_for_test(cfg, tmp_path)
    cluster = result["kafka_cluster"]
    assert cluster["error"] is None, detail
    leader, rolling = cluster["faults"]
    # The busiest leader was killed and its partitions moved; it came back and caught up.
    assert leader["fault"] == "leader" and leader["partitions_led"] >= leader["partitions"] / 3, detail
    assert leader["leaders_moved_s"] is not None, detail
    assert rolling["fault"] == "rolling" and [n["node"] for n in rolling["nodes"]] == [1, 2, 3], detail
    assert_answered_exactly_once(result, detail)
