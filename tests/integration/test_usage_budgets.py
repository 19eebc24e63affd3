"""Usage budgets on the real broker and Redis, with two workers: a chat over its token budget gets
the notice after the turn that crossed it (and no more turns); after a worker is SIGKILLed mid-turn,
and when a turn's usage records are delivered again, nothing is accounted twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from pipeline.bench.measure import TLS, metric_sum, scrape_metrics
from pipeline.controls.budget_store import BudgetStore
from pipeline.controls.budgets import Budgets, Scope, window_at
from pipeline.embedded import RedisServer
from pipeline.records import SessionEventRecord
from pipeline.session.models import SessionUsage
from pipeline.stack import SIM_API_KEY, Stack, WorkerProcess
from pipeline.state import State
from pipeline.topics import SESSION_EVENTS
from tests.conftest import enabled_brokers

from .console import ConsoleClient, texts
from .stacks import add_workers, running_stack, stack_idle

pytestmark = [pytest.mark.integration]

BOTS_TOML = """
[[bots]]
platform = "console"
bot_id = "budget"
self_id = "bot"
language = "en"
admins = ["boss"]

[bots.budgets]
timezone = "Europe/Berlin"
per_chat = { tokens = 1000 }
"""
BOT = "console:budget"
SPENT = "This chat has used up its usage budget. I can answer again after "


@pytest.fixture(scope="module", params=enabled_brokers())
def stack(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[Stack]:
    with running_stack(request.param, name="budgets", bots_toml=BOTS_TOML, redis_url=redis_server.url) as stack:
        asyncio.run(add_workers(stack, 1))  # two workers share the partitions (and the budgets)
        yield stack


@pytest.fixture
def console(stack: Stack) -> ConsoleClient:
    return ConsoleClient(stack, bot_id="budget")


@pytest.fixture
async def store(stack: Stack) -> AsyncIterator[BudgetStore]:
    settings = stack.settings()
    state = State.connect(settings.redis_url or "", settings.redis_prefix)
    yield BudgetStore(state.redis, state.keys)
    await state.redis.aclose()


async def chat_tokens(store: BudgetStore, chat: str, scope: Scope = "chat") -> int:
    window = window_at(Budgets(timezone="Europe/Berlin"), datetime.now(UTC))
    (totals,) = await store.totals([store.totals_key(BOT, window, scope, chat)])
    return totals.tokens


async def session_events(session_id: str, stack: Stack) -> list[dict[str, object]]:
    assert stack.sim is not None
    async with httpx.AsyncClient(timeout=10, headers={"x-api-key": SIM_API_KEY}) as http:
        response = await http.get(f"{stack.sim.url}/v1/sessions/{session_id}/events", params={"limit": 100})
    response.raise_for_status()
    return list(response.json()["data"])


async def test_a_chat_over_its_token_budget_gets_the_notice_after_the_turn_that_crossed_it(
    console: ConsoleClient, store: BudgetStore, stack: Stack
) -> None:
    chat = console.chat("over")
    await console.send(chat, "one [sim:usage=input:600,output:100]")
    await console.wait_for(chat, 1)
    await console.send(chat, "two [sim:usage=input:400,output:100]")  # 700 + 500: crosses 1000
    await console.wait_for(chat, 2)
    await console.send(chat, "three")
    await console.wait_for(chat, 3)
    await console.send(chat, "four")  # the notice is not repeated for every message
    got = texts(await console.settle(chat))
    assert got[:2] == ["echo: one", "echo: two"]
    assert len(got) == 3 and got[2].startswith(SPENT), got
    assert await chat_tokens(store, chat) == 1200
    session_id = await console.session_of(chat)
    assert session_id is not None
    events = await session_events(session_id, stack)
    assert sum(1 for e in events if e["type"] == "user.message") == 2  # no turn after the crossing
    # An admin grants more: the chat's turns start again.
    await console.send(chat, "/grant 1k", user_id="boss")
    # The grant takes effect once it is confirmed: a message in the same ingest batch as the
    # command is checked against the budget before the command runs (docs/controls.md).
    await console.wait_for(chat, 4)
    await console.send(chat, "five")
    got = texts(await console.wait_for(chat, 5))
    assert got[3].startswith("Granted 1000 tokens more to this chat") and got[4] == "echo: five"


async def _turn_holder(workers: list[WorkerProcess], timeout: float = 20.0) -> WorkerProcess:
    """The worker running a turn now (its `switchboard_worker_idle` is 0; the other's is 1)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with httpx.AsyncClient(timeout=5, verify=TLS) as http:
        while True:
            busy = [
                w for w in workers if metric_sum(await scrape_metrics(w.url, http), "switchboard_worker_idle") == 0.0
            ]
            if len(busy) == 1:
                return busy[0]
            assert asyncio.get_running_loop().time() < deadline, "no single worker runs the turn"
            await asyncio.sleep(0.05)  # polling the workers' metrics: nothing to wait on in-process


async def test_replayed_usage_after_a_sigkill_counts_once(
    console: ConsoleClient, store: BudgetStore, stack: Stack
) -> None:
    chat = console.chat("crash")
    await console.send(chat, "warm [sim:usage=input:100,output:0]")
    await console.wait_for(chat, 1)
    await stack_idle(stack)
    await console.send(chat, "[sim:think=4] [sim:usage=input:300,output:50] survive")
    victim = await _turn_holder([w for w in stack.workers if w.is_running])
    await victim.kill()  # SIGKILL mid-turn: the new owner resumes the stream and replays the turn
    assert not victim.is_running
    await add_workers(stack)
    got = texts(await console.wait_for(chat, 2, timeout=90))
    got = texts(await console.settle(chat))
    assert got == ["echo: warm", "echo: survive"]
    assert await chat_tokens(store, chat) == 450
    assert await chat_tokens(store, "u1", "user") >= 450  # the console's default sender

    # Every usage report of the session delivered again, as a replay of uncommitted records would.
    session_id = await console.session_of(chat)
    assert session_id is not None
    reports = [e for e in await session_events(session_id, stack) if e["type"] == "session.usage"]
    assert len(reports) == 2
    producer = AIOKafkaProducer(bootstrap_servers=stack.settings().kafka_bootstrap)
    await producer.start()
    try:
        for report in reports:
            record = SessionEventRecord(
                conversation_key=f"{BOT}:{chat}",
                session_id=session_id,
                event=SessionUsage.model_validate(report),
            )
            await producer.send_and_wait(
                SESSION_EVENTS, record.model_dump_json(exclude_none=True).encode(), key=record.conversation_key.encode()
            )
    finally:
        await producer.stop()
    await stack_idle(stack)
    assert await chat_tokens(store, chat) == 450
    assert texts(await console.messages(chat)) == ["echo: warm", "echo: survive"]
