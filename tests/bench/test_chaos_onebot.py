"""The chaos bench's long-connection accounting, on synthetic data: it must catch a loss and a
duplicate (or the chaos run would prove nothing), and tell a frame lost in a dead socket (OneBot
acknowledges nothing) from one lost after it was read."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer

from pipeline.bench.chaos_onebot import Written, account_onebot, dead_lettered_outcome_unknown
from pipeline.bench.onebot_peer import Action, Socket
from pipeline.kafka.testing import TopicFactory
from pipeline.records import DeadLetter


def _reply(n: int, socket: int = 2, at: float = 0.0) -> Action:
    message = [{"type": "reply", "data": {"id": str(n)}}, {"type": "text", "data": {"text": f"echo: ob{n}"}}]
    return Action("send_private_msg", {"user_id": 1, "message": message}, socket, at, {"status": "ok"})


def test_every_written_message_answered_once() -> None:
    sockets = [Socket(1, "universal", "w1", opened=0.0, closed=10.0), Socket(2, "universal", "w2", opened=10.6)]
    written = [Written(1, 1, 1.0), Written(2, 1, 2.0), Written(3, 2, 11.0)]
    acc = account_onebot(3, written, [_reply(1), _reply(2), _reply(3)], sockets)
    assert (acc["lost"], acc["lost_in_dead_socket"], acc["duplicated"], acc["answered"]) == (0, 0, 0, 3)
    assert acc["reconnect_gaps_s"] == [0.6]


def test_loss_dead_socket_loss_and_duplicate_are_told_apart() -> None:
    sockets = [Socket(1, "universal", "w1", opened=0.0, closed=10.0), Socket(2, "universal", "w2", opened=10.6)]
    written = [
        Written(1, 1, 1.0),  # answered twice
        Written(2, 1, 9.7),  # written 300 ms before its socket closed, never answered: the protocol's loss
        Written(3, 1, 5.0),  # read long before the close, never answered: a real loss
        Written(4, 2, 11.0),  # on the open socket, never answered: a real loss
    ]
    acc = account_onebot(4, written, [_reply(1), _reply(1, socket=1)], sockets)
    assert acc["duplicated_ids"] == [1]
    assert acc["lost_in_dead_socket_ids"] == [2]
    assert acc["lost_ids"] == [3, 4]


def test_a_turn_the_session_api_refused_is_answered_by_a_notice_not_lost() -> None:
    """The chaos run injects 429s and 500s into the session API: a turn still refused after the
    client's retries gets a notice (`overloaded`, `provider_error`), and dispatch dead-letters it."""
    sockets = [Socket(1, "universal", "w1", opened=0.0)]
    written = [Written(1, 1, 1.0), Written(2, 1, 2.0), Written(3, 1, 3.0)]
    acc = account_onebot(3, written, [_reply(1)], sockets, noticed={2})
    assert acc["answered_by_notice_ids"] == [2]
    assert acc["lost_ids"] == [3]  # no notice, no answer: still lost


def test_a_slow_answer_is_late_not_lost_and_latency_is_from_the_write_to_the_first_answer() -> None:
    sockets = [Socket(1, "universal", "w1", opened=0.0)]
    written = [Written(1, 1, 1.0), Written(2, 1, 2.0)]
    replies = [_reply(1, 1, at=2.5), _reply(2, 1, at=40.0), _reply(2, 1, at=41.0)]
    acc = account_onebot(2, written, replies, sockets, late_after=30.0)
    assert acc["lost"] == 0 and acc["late_ids"] == [2] and acc["duplicated_ids"] == [2]
    assert acc["answer_latency_ms"]["max"] == 38_000 and acc["answer_latency_ms"]["p50"] in (1_500, 38_000)


def test_a_reply_not_sent_again_because_its_outcome_is_unknown_is_counted_apart_from_lost() -> None:
    sockets = [Socket(1, "universal", "w1", opened=0.0, closed=10.0), Socket(2, "universal", "w2", opened=10.6)]
    written = [Written(1, 1, 1.0), Written(2, 1, 5.0), Written(3, 2, 11.0)]
    acc = account_onebot(3, written, [_reply(1)], sockets, outcome_unknown={2, 99})
    assert acc["outcome_unknown_ids"] == [2] and acc["lost_ids"] == [3]


@pytest.mark.integration
async def test_outcome_unknown_replies_are_read_from_the_dead_letter_topic(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    topic = await topic_factory(partitions=2)
    letters = [
        DeadLetter(stage="egress", reason="outcome_unknown", key="onebot:napcat:p1", record='"echo: ob7" napcat'),
        DeadLetter(stage="egress", reason="rejected", key="onebot:napcat:p1", record='"echo: ob8" napcat'),
        DeadLetter(stage="ingress", reason="outcome_unknown", record='"ob9" napcat'),
        DeadLetter(stage="egress", reason="outcome_unknown", key="onebot:napcat:p2", record='"echo: ob12" napcat'),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:
        for i, letter in enumerate(letters):
            await producer.send_and_wait(topic, letter.model_dump_json().encode(), partition=i % 2)
    finally:
        await producer.stop()
    assert await dead_lettered_outcome_unknown(kafka_bootstrap, topic) == {7, 12}
