"""The operator tools' Kafka reading on the real broker (each of SWITCHBOARD_TEST_BROKERS): every
record to the end, also where the broker's reported end lags (Tansu answers ListOffsets with the
last batch's base offset + 1), and the last records of one key from the end of its partition."""

from __future__ import annotations

from pipeline.kafka import produce_many
from pipeline.kafka.testing import TopicFactory
from pipeline.operator.kafka import last_records_of_key, read_dead_letters, read_record
from pipeline.records import DeadLetter


async def test_every_dead_letter_is_read_including_the_last_batchs(
    kafka_bootstrap: str, kafka_fetch_max_wait_ms: int, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=1)
    # Three batches of ten: Tansu reports the end as the last batch's base offset + 1 (21), so a
    # reader bounded by the reported end would miss the last batch's other nine.
    letters = [DeadLetter(stage="egress", reason="blocked" if i % 2 else "x", record="{}") for i in range(30)]
    for start in range(0, 30, 10):
        await produce_many(
            kafka_bootstrap, topic, [("k", d.model_dump_json().encode()) for d in letters[start : start + 10]]
        )
    total, kept = await read_dead_letters(
        kafka_bootstrap,
        lambda letter: letter.reason == "blocked",
        fetch_max_wait_ms=kafka_fetch_max_wait_ms,
        topic=topic,
    )
    assert total == 30
    assert [letter.offset for letter in kept] == list(range(1, 30, 2))
    empty = await topic_factory(partitions=2)
    assert await read_dead_letters(kafka_bootstrap, fetch_max_wait_ms=kafka_fetch_max_wait_ms, topic=empty) == (0, [])


async def test_the_last_records_of_a_key_and_one_record_by_offset(
    kafka_bootstrap: str, kafka_fetch_max_wait_ms: int, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=3)
    records = [(f"key-{i % 4}", f"value-{i}".encode()) for i in range(40)]
    for start in range(0, 40, 8):
        await produce_many(kafka_bootstrap, topic, records[start : start + 8])
    last = await last_records_of_key(
        kafka_bootstrap, topic, "key-1", count=3, step=2, fetch_max_wait_ms=kafka_fetch_max_wait_ms
    )
    assert [r.value for r in last] == [b"value-29", b"value-33", b"value-37"]  # the newest included
    assert (
        await last_records_of_key(kafka_bootstrap, topic, "key-none", fetch_max_wait_ms=kafka_fetch_max_wait_ms) == []
    )
    found = await read_record(
        kafka_bootstrap, topic, last[0].partition, last[0].offset, fetch_max_wait_ms=kafka_fetch_max_wait_ms
    )
    assert found is not None and found.value == b"value-29"
    assert await read_record(kafka_bootstrap, topic, 7, 0) is None  # no such partition
