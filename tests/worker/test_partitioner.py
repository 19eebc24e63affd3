"""The worker's producer partitioner picks aiokafka's default partition for every key."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from pipeline.worker.driver import KeyPartitioner


def test_same_partition_as_aiokafkas_default_for_every_key_and_count() -> None:
    default, cached = DefaultPartitioner(), KeyPartitioner(max_keys=50)
    for count in (1, 3, 8, 24):
        partitions = list(range(count))
        for n in range(200):  # past the bound: the memory is refilled
            key = f"console:demo:chat-{n}".encode()
            assert cached(key, partitions, partitions) == default(key, partitions, partitions)
            assert cached(key, partitions, partitions) == default(key, partitions, partitions)  # remembered


def test_records_without_a_key_are_spread() -> None:
    partitions = list(range(8))
    assert {KeyPartitioner()(None, partitions, partitions) for _ in range(200)} == set(partitions)
