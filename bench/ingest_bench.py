"""Worker CPU per chatter message in ingest's own code, without a broker.

    .venv/bin/python bench/ingest_bench.py [--url redis://…] [--messages 60000] [--batch 500] [--rounds 5]

Group messages that trigger nothing (the bulk of a busy group's traffic) go through the ingest
stage's runner as the worker's driver hands them over: `StageRunner.deliver` on batches of fetched
records (JSON values), the batch step `IngestStage.admit` with its one Redis script call, the keyed
executor and the acknowledgements. Against a real Redis (an embedded one without `--url`); nothing
is produced. Prints process CPU per message for each round and the best: the broker's share of a
filtered backlog drain (`switchboard bench --filtered`) is not in it, so this isolates what the
pipeline's own code costs. Compare runs interleaved on one machine, never across days.
"""

from __future__ import annotations

import argparse
import gc
import time

import uvloop
from faust.transport.consumer import ConsumerMessage
from faust.types import TP, Message

from pipeline.embedded.redis import RedisServer
from pipeline.executor import KeyedExecutor
from pipeline.records import InboundMessage, Sender, now_ms
from pipeline.settings import Settings
from pipeline.stages.ingest import IngestStage
from pipeline.stages.notify import Notifier
from pipeline.stages.outputs import Outputs
from pipeline.state import State
from pipeline.topics import IM_INBOUND
from pipeline.worker import collector
from pipeline.worker.stage import Stage, StageRunner

_PARTITIONS = 8
_CHATS = 200


def _records(first: int, count: int) -> list[Message]:
    """`count` fetched records of chatter (no mention, no command) from offset `first` on."""
    out: list[Message] = []
    for i in range(first, first + count):
        chat = f"g{i % _CHATS}"
        at = now_ms()
        value = InboundMessage(
            platform="console",
            bot_id="demo",
            chat_id=chat,
            chat_type="group",
            sender=Sender(user_id=f"u{i % 50}", name=f"User {i % 50}"),
            message_id=f"m{i}",
            text="just chatting about the weather and lunch plans",
            conversation_key=f"console:demo:{chat}",
            trace_id=f"{i:032x}",
            sent_at_ms=at,
            hops={"ingress": at},
        ).model_dump_json()
        tp = TP(IM_INBOUND, i % _PARTITIONS)
        out.append(
            ConsumerMessage(IM_INBOUND, tp.partition, i, 0.0, 0, [], chat.encode(), value.encode(), None, 0, 0, tp)
        )
    return out


async def _run(url: str, messages: int, batch: int, rounds: int) -> None:
    settings = Settings(redis_prefix=f"ingest-bench-{time.time_ns()}:", console_enabled=True)
    state = State.connect(url, settings.redis_prefix)

    async def produce(topic: str, key: str | None, value: bytes) -> None:
        raise AssertionError("chatter produces nothing")

    outputs = Outputs(produce)
    ingest = IngestStage(settings, state, outputs, Notifier(settings), lambda bot, message, window: None)
    executor = KeyedExecutor(settings.max_in_flight, name="ingest")
    acked = 0

    def ack(message: Message) -> None:
        nonlocal acked
        acked += 1

    runner = StageRunner(Stage("ingest", IM_INBOUND, InboundMessage, ingest.admit), executor, outputs, ack)
    collector.tune()  # as the worker runs
    offset = 0
    for number in range(rounds + 1):  # round 0 warms up
        gc.unfreeze()
        batches = [_records(offset + k, min(batch, messages - k)) for k in range(0, messages, batch)]
        offset += messages
        gc.collect()
        gc.freeze()  # the records made up front are not the stage's garbage
        cpu, wall = time.process_time(), time.perf_counter()
        for records in batches:
            await runner.deliver(records)
        await executor.join()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        if number:
            print(f"round {number}: {cpu / messages * 1e6:6.1f} µs CPU per message, {messages / wall:8.0f} messages/s")
    assert acked == messages * (rounds + 1), f"{acked} acknowledged of {messages * (rounds + 1)}"
    await state.redis.aclose()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", help="a Redis to use (default: an embedded one)")
    p.add_argument("--messages", type=int, default=60_000, help="messages per round")
    p.add_argument("--batch", type=int, default=256, help="records per delivery (the worker's batch_max)")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    if args.url:
        await _run(args.url, args.messages, args.batch, args.rounds)
        return
    server = RedisServer()
    await server.start()
    try:
        await _run(server.url, args.messages, args.batch, args.rounds)
    finally:
        await server.stop()


if __name__ == "__main__":
    uvloop.run(main())
