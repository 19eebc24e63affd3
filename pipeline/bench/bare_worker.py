"""The bare turn's worker: a Switchboard turn's I/O, hand-written with aiohttp, aiokafka and json.

Started by `switchboard bench` (`pipeline.bench.bare_turn`); the reference the pipeline's turns/s
and CPU per turn are compared with. Per turn, the same I/O as a worker on the console platform:

  POST /webhooks/console/{bot}   JSON body parsed; answered once the broker acked its record on topic 1
  topic 1 (inbound)  → the trigger decision (private chat, or @bot in a group) → topic 2
  topic 2 (input)    → the busy policy (merge or queue, in memory); open the session's SSE stream,
                       POST the user.message, read the stream until session.status_idle
                       → the final agent.message and the idle, 2 records → topic 3
  topic 3 (events)   → the reply: the agent.message's {"segments": [...]} → topic 4
  topic 4 (outbound) → POST to the platform

Nothing else: no pydantic, no Faust, no Redis; one consumer over the four topics (assigned, no
group, no offset commits) and one producer, with the worker's fetch wait, batch size, linger and
acks. Listens on 127.0.0.1 only. Keys come from the environment: BARE_SESSION_API_KEY (the session
API's bearer key) and BARE_PLATFORM_TOKEN (the platform stand-in's bearer token).

    python -m pipeline.bench.bare_worker --bootstrap 127.0.0.1:9092 --topics a,b,c,d --port 8099 \\
        --session-base http://127.0.0.1:8090/api/v3 --sim-admin http://127.0.0.1:8090 \\
        --platform-url http://127.0.0.1:8091
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from pipeline.errors import SwitchboardError
from pipeline.hopstamps import AckJoin

LOOP_PROBE_SECONDS = 0.1  # the pipeline's LoopWatch interval


def dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def now_ms() -> float:
    return time.time() * 1000.0


class TurnFailed(SwitchboardError):
    """The session call of a turn did not end in an idle (counted; the turn gets no reply)."""


@dataclass(frozen=True)
class BareConfig:
    bootstrap: str
    topics: tuple[str, str, str, str]  # inbound, input, events, outbound
    partitions: int
    port: int
    session_base: str  # the session API's data plane, e.g. http://127.0.0.1:PORT/api/v3
    sim_admin: str  # the simulator's root: sessions are created through its /_sim/sessions
    platform_url: str
    session_api_key: str
    platform_token: str
    fetch_max_wait_ms: int = 20
    batch_max: int = 256
    linger_ms: int = 0
    busy_policy: str = "merge"
    merge_window_max: int = 20
    self_id: str = "bot"


class BareWorker:
    def __init__(self, cfg: BareConfig) -> None:
        self.cfg = cfg
        self.inbound_topic, self.input_topic, self.events_topic, self.outbound_topic = cfg.topics
        self.stats: dict[str, int] = defaultdict(int)
        self.sessions: dict[str, str] = {}  # conversation -> session id
        self.running: set[str] = set()  # conversations with a turn in flight
        self.held: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.last_message: dict[str, dict[str, Any]] = {}  # conversation -> its turn's agent.message
        self.ready = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._auth = {"Authorization": f"Bearer {cfg.session_api_key}"}
        self._post_headers = {**self._auth, "Content-Type": "application/json"}
        self._sse_headers = {**self._auth, "Accept": "text/event-stream"}
        self._platform_headers = {"Authorization": f"Bearer {cfg.platform_token}", "Content-Type": "application/json"}
        self.producer = AIOKafkaProducer(bootstrap_servers=cfg.bootstrap, linger_ms=cfg.linger_ms, acks="all")
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=cfg.fetch_max_wait_ms,
            max_partition_fetch_bytes=4 * 1024 * 1024,
        )
        self.session_http: aiohttp.ClientSession | None = None
        self.platform_http: aiohttp.ClientSession | None = None
        self._consume_task: asyncio.Task[None] | None = None
        # The hops' parts, stamped as the pipeline stamps them with SWITCHBOARD_HOP_STAMPS
        # (pipeline/hopstamps.py): <stage>.sent / .acked / .fetched / .started.
        self.acks = AckJoin()
        self._handlers: dict[str, Callable[[ConsumerRecord[bytes, bytes], float], Awaitable[None]]] = {
            self.inbound_topic: self._inbound,
            self.input_topic: self._input,
            self.events_topic: self._event,
            self.outbound_topic: self._outbound,
        }

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=90)
        self.session_http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout)
        self.platform_http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256), timeout=aiohttp.ClientTimeout(total=30)
        )
        await self.producer.start()
        await self.consumer.start()
        tps = [TopicPartition(t, p) for t in self.cfg.topics for p in range(self.cfg.partitions)]
        self.consumer.assign(tps)
        await self.consumer.seek_to_end(*tps)
        for tp in tps:  # resolve the lazy seek now: records produced from here on are read
            await self.consumer.position(tp)
        self._consume_task = asyncio.create_task(self._consume())
        self._spawn(self._watch_loop())
        self.ready = True

    async def stop(self) -> None:
        self.ready = False
        tasks = [t for t in (self._consume_task, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for close in (self.consumer.stop, self.producer.stop):
            with contextlib.suppress(Exception):
                await close()
        for http in (self.session_http, self.platform_http):
            if http is not None:
                await http.close()

    async def _watch_loop(self) -> None:
        """How late a 100 ms timer fires, as the pipeline's `LoopWatch` measures it: what any ready
        callback waits for the loop, summed for the bench (`loop_lag_us`, `loop_lag_samples`)."""
        while True:
            started = time.perf_counter()
            await asyncio.sleep(LOOP_PROBE_SECONDS)
            lag = max(0.0, time.perf_counter() - started - LOOP_PROBE_SECONDS)
            self.stats["loop_lag_us"] += int(lag * 1e6)
            self.stats["loop_lag_samples"] += 1

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- HTTP: the webhook in ------------------------------------------------------------------
    async def webhook(self, request: web.Request) -> web.Response:
        received = now_ms()
        bot = request.match_info["bot"]
        try:
            body = json.loads(await request.read())
            chat_id, text = str(body["chat_id"]), str(body["text"])
            mentions = [str(m) for m in body.get("mentions") or []]
        except (ValueError, KeyError, TypeError, AttributeError):
            self.stats["webhooks_malformed"] += 1
            return web.json_response({"ok": False, "error": "malformed: chat_id and text are required"}, status=400)
        message_id = str(body.get("message_id") or f"{received:.0f}")
        conversation = f"console:{bot}:{chat_id}"
        record = {
            "conversation": conversation,
            "bot": bot,
            "chat_id": chat_id,
            "chat_type": "group" if body.get("chat_type") == "group" else "private",
            "user_id": str(body.get("user_id") or ""),
            "message_id": message_id,
            "text": text,
            "mentions": mentions,
            "hops": {"ingress": received, "ingest.sent": now_ms()},
        }
        delivery = await self._send(self.inbound_topic, dumps(record), conversation.encode())
        await delivery  # answered once the broker has it (acks=all), as the worker's ingress does
        self.stats["webhooks"] += 1
        return web.json_response({"ok": True, "message_id": message_id})

    async def stats_handler(self, request: web.Request) -> web.Response:
        return web.json_response(dict(self.stats))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    # -- Kafka: four topics, one consumer ------------------------------------------------------
    async def _consume(self) -> None:
        handlers = self._handlers
        while True:
            batch = await self.consumer.getmany(timeout_ms=1000, max_records=self.cfg.batch_max)
            fetched = now_ms()
            for tp, records in batch.items():
                handle = handlers[tp.topic]
                for record in records:
                    try:
                        await handle(record, fetched)
                    except (ValueError, KeyError, TypeError) as exc:
                        self.stats[f"bad_record:{type(exc).__name__}"] += 1

    async def _send(self, topic: str, value: bytes, key: bytes | None) -> asyncio.Future[Any]:
        delivery = await self.producer.send(topic, value, key=key)
        delivery.add_done_callback(self.acks.on_delivery)
        return delivery

    def _stamp(self, stage: str, record: ConsumerRecord[bytes, bytes], hops: dict[str, float], fetched: float) -> None:
        """A record's arrival at `stage`: given to the stage (the fetch's end), acknowledged to its
        producer (joined by position), and its work started (now: records are handled in turn)."""
        hops[f"{stage}.fetched"] = fetched
        self.acks.read(record.topic, record.partition, record.offset, hops, f"{stage}.acked")
        hops[f"{stage}.started"] = now_ms()

    async def _inbound(self, record: ConsumerRecord[bytes, bytes], fetched: float) -> None:
        key = record.key
        message = json.loads(record.value or b"")
        self._stamp("ingest", record, message["hops"], fetched)
        self.stats["ingested"] += 1
        if message["chat_type"] == "group" and self.cfg.self_id not in message["mentions"]:
            return  # a group message without @bot: nothing to do
        message["hops"]["ingest"] = now_ms()
        command = {
            "conversation": message["conversation"],
            "bot": message["bot"],
            "chat_id": message["chat_id"],
            "message_ids": [message["message_id"]],
            "texts": [message["text"]],
            "hops": message["hops"],
        }
        self.stats["triggered"] += 1
        command["hops"]["dispatch.sent"] = now_ms()
        await self._send(self.input_topic, dumps(command), key)

    async def _input(self, record: ConsumerRecord[bytes, bytes], fetched: float) -> None:
        command = json.loads(record.value or b"")
        self._stamp("dispatch", record, command["hops"], fetched)
        command["hops"]["dispatch_in"] = now_ms()
        conversation = command["conversation"]
        if conversation in self.running:
            command["hops"]["held"] = now_ms()
            self.held[conversation].append(command)
            self.stats["held"] += 1
            return
        self.running.add(conversation)
        self._spawn(self._turn(command))

    async def _event(self, consumed: ConsumerRecord[bytes, bytes], fetched: float) -> None:
        key = consumed.key
        record = json.loads(consumed.value or b"")
        conversation = record["conversation"]
        event = record["event"]
        if event.get("type") == "agent.message":
            self.acks.read(consumed.topic, consumed.partition, consumed.offset, {}, "")  # (no hops: drop its ack)
            self.last_message[conversation] = event
            return
        message = self.last_message.pop(conversation, None)
        turn = record["turn"]
        self._stamp("render", consumed, turn["hops"], fetched)
        turn["hops"]["render"] = now_ms()
        segments = reply_segments(message)
        if segments is None:
            self.stats["replies_invalid"] += 1
            kind, segments = "notice", [{"type": "text", "data": {"text": "The agent's reply could not be shown."}}]
        else:
            kind = "reply"
        outbound = {
            "id": f"out-{event.get('id')}",
            "kind": kind,
            "bot": turn["bot"],
            "chat_id": turn["chat_id"],
            "reply_to": turn["reply_to"],
            "segments": segments,
            "hops": turn["hops"],
        }
        turn["hops"]["egress.sent"] = now_ms()
        await self._send(self.outbound_topic, dumps(outbound), key)

    async def _outbound(self, record: ConsumerRecord[bytes, bytes], fetched: float) -> None:
        message = json.loads(record.value or b"")
        hops = message["hops"]
        hops["egress.fetched"] = fetched
        self.acks.read(record.topic, record.partition, record.offset, hops, "egress.acked")
        self._spawn(self._post_platform(message))  # its work starts when that task runs

    # -- the session call: one POST, one SSE read ---------------------------------------------
    async def _turn(self, command: dict[str, Any]) -> None:
        conversation = command["conversation"]
        try:
            await self._run_turn(command)
            self.stats["turns"] += 1
        except (aiohttp.ClientError, KafkaError, TimeoutError, TurnFailed, ValueError, KeyError):
            self.stats["turn_errors"] += 1
        finally:
            following = self._take_held(conversation)
            if following is None:
                self.running.discard(conversation)
            else:
                self._spawn(self._turn(following))

    def _take_held(self, conversation: str) -> dict[str, Any] | None:
        """The next turn of a conversation: merge = the held messages as one turn, queue = the first."""
        held = self.held.get(conversation)
        if not held:
            self.held.pop(conversation, None)
            return None
        limit = self.cfg.merge_window_max if self.cfg.busy_policy == "merge" else 1
        taken, held[:] = held[:limit], held[limit:]
        turn = dict(taken[-1])
        turn["message_ids"] = [i for c in taken for i in c["message_ids"]]
        turn["texts"] = [t for c in taken for t in c["texts"]]
        turn["hops"] = {**taken[0]["hops"], "released": now_ms()}
        return turn

    async def _run_turn(self, command: dict[str, Any]) -> None:
        assert self.session_http is not None
        conversation = command["conversation"]
        session_id = self.sessions.get(conversation) or await self._create_session(conversation)
        hops = command["hops"]
        hops["dispatch"] = now_ms()
        events_url = f"{self.cfg.session_base}/sessions/{session_id}/events"
        user_message = {
            "type": "user.message",
            "id": f"sevt-bare-{command['message_ids'][-1]}",
            "content": [{"type": "text", "text": t} for t in command["texts"]],
        }
        self.stats["streams_open"] += 1
        try:
            # The stream is open once its headers arrive: every event after that is delivered.
            async with self.session_http.get(events_url + "/stream", headers=self._sse_headers) as stream:
                if stream.status != 200:
                    raise TurnFailed(f"stream answered {stream.status}")
                async with self.session_http.post(
                    events_url, data=dumps({"events": [user_message]}), headers=self._post_headers
                ) as sent:
                    await sent.read()
                    if sent.status != 200:
                        raise TurnFailed(f"send answered {sent.status}")
                message, idle = await read_until_idle(stream.content)
        finally:
            self.stats["streams_open"] -= 1
        hops["stream"] = now_ms()
        key = conversation.encode()
        turn = {"bot": command["bot"], "chat_id": command["chat_id"], "reply_to": command["message_ids"][-1]}
        if message is not None:
            await self._send(self.events_topic, dumps({"conversation": conversation, "event": message}), key)
        hops["render.sent"] = now_ms()
        record = {"conversation": conversation, "event": idle, "turn": {**turn, "hops": hops}}
        await self._send(self.events_topic, dumps(record), key)

    async def _create_session(self, conversation: str) -> str:
        """Once per conversation (the bench's warm-up creates them all)."""
        assert self.session_http is not None
        async with self.session_http.post(f"{self.cfg.sim_admin}/_sim/sessions") as response:
            if response.status != 200:
                raise TurnFailed(f"session create answered {response.status}")
            session_id = str((await response.json())["id"])
        self.sessions[conversation] = session_id
        self.stats["sessions_created"] += 1
        return session_id

    # -- the platform call ---------------------------------------------------------------------
    async def _post_platform(self, message: dict[str, Any]) -> None:
        assert self.platform_http is not None
        message["hops"]["egress.started"] = now_ms()
        payload = {k: message[k] for k in ("id", "kind", "chat_id", "reply_to", "segments", "hops")}
        try:
            async with self.platform_http.post(
                f"{self.cfg.platform_url}/bots/{message['bot']}/messages",
                data=dumps(payload),
                headers=self._platform_headers,
            ) as response:
                await response.read()
                outcome = "replies_posted" if response.status == 200 else f"platform_{response.status}"
        except (aiohttp.ClientError, TimeoutError):
            outcome = "platform_errors"
        self.stats[outcome] += 1


async def read_until_idle(content: aiohttp.StreamReader) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The last agent.message and the session.status_idle of an SSE stream (other events skipped
    by their `event:` line, unparsed)."""
    event_type = b""
    message: dict[str, Any] | None = None
    async for line in content:
        if line.startswith(b"event:"):
            event_type = line[6:].strip()
        elif line.startswith(b"data:"):
            if event_type == b"agent.message":
                message = json.loads(line[5:])
            elif event_type == b"session.status_idle":
                return message, json.loads(line[5:])
    raise TurnFailed("the stream ended before session.status_idle")


def reply_segments(message: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The agent's `{"segments": [...]}` reply, or None when it is not one."""
    if message is None:
        return None
    text = "".join(b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text")
    try:
        reply = json.loads(text)
    except ValueError:
        return None
    segments = reply.get("segments") if isinstance(reply, dict) else None
    if not isinstance(segments, list) or not segments:
        return None
    if not all(isinstance(s, dict) and isinstance(s.get("type"), str) for s in segments):
        return None
    return segments


async def serve(cfg: BareConfig) -> None:
    worker = BareWorker(cfg)
    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/webhooks/console/{bot}", worker.webhook)
    app.router.add_get("/healthz", worker.health)
    app.router.add_get("/stats", worker.stats_handler)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await worker.start()
        # Listening only once the consumer is positioned: ready means nothing produced is missed.
        await web.TCPSite(runner, "127.0.0.1", cfg.port, backlog=4096).start()
        await stop.wait()
    finally:
        await runner.cleanup()
        await worker.stop()


def parse_args(argv: list[str] | None = None) -> BareConfig:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topics", required=True, help="inbound,input,events,outbound")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--session-base", required=True)
    ap.add_argument("--sim-admin", required=True)
    ap.add_argument("--platform-url", required=True)
    ap.add_argument("--fetch-wait-ms", type=int, default=20)
    ap.add_argument("--batch-max", type=int, default=256)
    ap.add_argument("--linger-ms", type=int, default=0)
    ap.add_argument("--busy-policy", choices=["merge", "queue"], default="merge")
    ap.add_argument("--merge-window-max", type=int, default=20)
    args = ap.parse_args(argv)
    topics = tuple(args.topics.split(","))
    if len(topics) != 4:
        ap.error("--topics takes four names: inbound,input,events,outbound")
    session_key, platform_token = os.environ.get("BARE_SESSION_API_KEY"), os.environ.get("BARE_PLATFORM_TOKEN")
    if not session_key or not platform_token:
        ap.error("BARE_SESSION_API_KEY and BARE_PLATFORM_TOKEN must be set in the environment")
    return BareConfig(
        bootstrap=args.bootstrap,
        topics=(topics[0], topics[1], topics[2], topics[3]),
        partitions=args.partitions,
        port=args.port,
        session_base=args.session_base.rstrip("/"),
        sim_admin=args.sim_admin.rstrip("/"),
        platform_url=args.platform_url.rstrip("/"),
        session_api_key=session_key,
        platform_token=platform_token,
        fetch_max_wait_ms=args.fetch_wait_ms,
        batch_max=args.batch_max,
        linger_ms=args.linger_ms,
        busy_policy=args.busy_policy,
        merge_window_max=args.merge_window_max,
    )


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(parse_args(argv)))


if __name__ == "__main__":
    main()
