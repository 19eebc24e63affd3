"""Discord end to end: messages in over the Gateway, replies out over REST, through a real broker,
Redis, the simulator and two worker processes. The stand-in (`tests/connections/discord_standin.py`)
is the Gateway and the REST API in one, served from a thread of its own; the simulator's agent
echoes, so a DM `m<n>` is answered `echo: m<n>`.

Covered: one reply per message; a dispatch Discord sends twice (same message id) answered once; a
429 once (JSON `retry_after`) answered once after the wait; a permanent error (50001 Missing
Access) dead-lettered once with Discord's message; a signed slash command answered with a deferred
response, then edited with the reply; the Gateway's holder SIGKILLed, a survivor takes the lease
and RESUMEs the session from the sequence in Redis, and every message is answered once.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import Counter, deque
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pipeline.embedded import RedisServer
from pipeline.kafka import ConsumeTimeoutError, consume_until
from pipeline.stack import Stack
from pipeline.topics import DEADLETTER
from tests.conftest import enabled_brokers
from tests.connections.discord_standin import DiscordGatewayStandIn
from tests.platforms.test_discord import BOT_USER, PUBLIC_KEY, SLASH, TOKEN, message_create, signed

from .loop_thread import LoopThread
from .stacks import add_workers, running_stack, stack_idle
from .test_long_connections import TAKEOVER_QUIET_SECONDS, lease_holder, wait_for

pytestmark = [pytest.mark.integration]


class DiscordThread(LoopThread[DiscordGatewayStandIn]):
    def __init__(self) -> None:
        async def make() -> DiscordGatewayStandIn:
            standin = DiscordGatewayStandIn(heartbeat_ms=2000)
            await standin.start()
            return standin

        async def close(standin: DiscordGatewayStandIn) -> None:
            await standin.stop()

        super().__init__("discord-standin", make, close)

    @property
    def it(self) -> DiscordGatewayStandIn:
        assert self.standin is not None
        return self.standin

    async def send(self, n: int, text: str | None = None, message_id: str | None = None) -> int:
        """A DM from user n in its own channel; the sequence number Discord gave it."""
        d = message_create(text or f"m{n}", guild=False, id=message_id or f"{77 * 10**16 + n}")
        d["channel_id"] = channel(n)
        d["author"] = dict(d["author"], id=f"{22 * 10**17 + n}")
        return int(await self._on_loop(self.it.send_message(d)))


def channel(n: int) -> str:
    return f"{66 * 10**17 + n}"


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def discord(broker_kind: str) -> Iterator[DiscordThread]:
    thread = DiscordThread()
    thread.start_loop()
    try:
        yield thread
    finally:
        thread.stop_loop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, discord: DiscordThread) -> Iterator[Stack]:
    toml = (
        '[[bots]]\nplatform = "discord"\nbot_id = "dc1"\ntransport = "gateway"\n'
        f'self_id = "{BOT_USER}"\napi_base = "{discord.it.url}"\nlanguage = "en"\n'
        f'credentials = {{ token = "{TOKEN}", public_key = "{PUBLIC_KEY}" }}\n'
    )
    with running_stack(broker_kind, name="discord", bots_toml=toml, redis_url=redis_server.url) as s:
        asyncio.run(add_workers(s))
        yield s


@pytest.fixture(autouse=True)
def _standin_saw_only_valid_requests(discord: DiscordThread) -> Iterator[None]:
    yield
    assert discord.it.errors == [], "requests or frames Discord would refuse"


_numbers = itertools.count(1)


def answered(discord: DiscordThread, numbers: range) -> Counter[int]:
    counts: Counter[int] = Counter()
    for n in numbers:
        for call in discord.it.messages_to(channel(n)):
            if call.status == 200 and call.created:
                assert call.seen.json["content"] == f"echo: m{n}", call.seen.json
                counts[n] += 1
    return counts


async def ready(discord: DiscordThread) -> None:
    await wait_for(lambda: discord.it.sessions and discord.it.open_sockets(), "the Gateway is held", 60)


async def test_a_message_is_answered_once_and_a_duplicate_dispatch_too(stack: Stack, discord: DiscordThread) -> None:
    await ready(discord)
    n, dup = next(_numbers), next(_numbers)
    await discord.send(n)
    await discord.send(dup)
    await discord.send(dup, message_id=f"{77 * 10**16 + dup}")  # Discord sent it again
    await wait_for(lambda: answered(discord, range(n, dup + 1)) == {n: 1, dup: 1}, "answered", 60)
    await stack_idle(stack)
    assert answered(discord, range(n, dup + 1)) == {n: 1, dup: 1}
    [call] = discord.it.messages_to(channel(n))
    assert call.seen.json["allowed_mentions"] == {"parse": [], "users": [], "replied_user": False}
    assert call.seen.json["message_reference"]["message_id"] == f"{77 * 10**16 + n}"


async def test_a_429_is_waited_out_and_answered_once(stack: Stack, discord: DiscordThread) -> None:
    await ready(discord)
    n = next(_numbers)
    limited = (429, {"message": "You are being rate limited.", "retry_after": 2.0, "global": False})
    discord.it.scripts[channel(n)] = deque([limited])
    await discord.send(n)
    await wait_for(lambda: answered(discord, range(n, n + 1)) == {n: 1}, "answered after the wait", 60)
    await stack_idle(stack)
    first, second = discord.it.messages_to(channel(n))
    assert (first.status, second.status) == (429, 200)
    assert second.at - first.at >= 1.9, second.at - first.at  # retry_after honoured
    assert first.seen.json == second.seen.json


async def test_a_permanent_error_is_dead_lettered_once(stack: Stack, discord: DiscordThread) -> None:
    await ready(discord)
    n = next(_numbers)
    discord.it.sticky[channel(n)] = (403, {"message": "Missing Access", "code": 50001})
    await discord.send(n)
    letters: list[dict[str, Any]] = []

    def dead(record: Any) -> bool:
        letter = json.loads(record.value)
        if letter["stage"] == "egress" and json.loads(letter["record"])["chat_id"] == channel(n):
            letters.append(letter)
        return bool(letters)

    try:
        await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, dead, timeout=45)
    except ConsumeTimeoutError as exc:
        raise AssertionError(f"no dead letter; calls: {discord.it.messages_to(channel(n))}") from exc
    await stack_idle(stack)
    [letter] = letters
    assert letter["reason"] == "missing_access" and "Missing Access" in letter["error"], letter
    assert letter["attempts"] == 1
    assert len(discord.it.messages_to(channel(n))) == 1  # a permanent error is not retried


async def test_a_slash_command_is_deferred_and_its_reply_edits_the_deferred_response(
    stack: Stack, discord: DiscordThread
) -> None:
    n = next(_numbers)
    token = f"aW50ZXJhY3Rpb24tdG9rZW4t{n:04d}"
    command = dict(SLASH, id=f"{99 * 10**16 + n}", token=token, channel_id=channel(n))
    command["data"] = {"id": "1", "name": "ask", "type": 1, "options": [{"name": "q", "type": 3, "value": f"m{n}"}]}
    request = signed(command)
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(
            f"{stack.workers[0].url}/webhooks/discord/dc1", content=request.body, headers=dict(request.headers)
        )
    assert (answer.status_code, answer.json()) == (200, {"type": 5})
    edits = lambda: discord.it.messages_to(f"interaction:{token}")  # noqa: E731
    await wait_for(lambda: edits(), "the deferred response edited", 60)
    await stack_idle(stack)
    [edit] = edits()
    assert edit.seen.method == "PATCH" and edit.seen.path.endswith("/messages/@original")
    # In a guild the agent sees who spoke (`[Alice (id)]`), and ingest takes `/ask` as the command prefix.
    content = edit.seen.json["content"]
    assert content.startswith("echo: ") and content.endswith(f" q=m{n}"), content


async def test_the_holder_sigkilled_a_survivor_resumes_and_every_message_is_answered_once(
    stack: Stack, discord: DiscordThread
) -> None:
    await ready(discord)
    holder, token = await lease_holder(stack, "dc1", platform="discord", channel="event")
    assert holder is not None
    session = list(discord.it.sessions)[-1]
    resumes_before = len(discord.it.resumes)
    first = next(_numbers)
    for _ in range(5):
        await discord.send(next(_numbers))
        await asyncio.sleep(0.2)
    await holder.kill()
    killed = time.monotonic()
    await wait_for(lambda: not discord.it.open_sockets(), "the stand-in saw the socket close", 15)
    for _ in range(5):  # sent while nobody holds the Gateway: Discord keeps them for the RESUME
        await discord.send(next(_numbers))
    await wait_for(lambda: len(discord.it.resumes) > resumes_before, "a survivor resumed", 60)
    takeover = time.monotonic() - killed
    resume = discord.it.resumes[-1]
    assert resume["session_id"] == session and isinstance(resume["seq"], int), resume
    new_holder, new_token = await lease_holder(stack, "dc1", platform="discord", channel="event")
    assert new_holder is not None and new_holder is not holder and new_token > token
    sent = range(first + 1, next(_numbers))
    await wait_for(lambda: set(answered(discord, sent)) == set(sent), f"all answered ({takeover:.1f} s takeover)", 120)
    await stack_idle(stack, quiet=TAKEOVER_QUIET_SECONDS)
    counts = answered(discord, sent)
    assert [n for n in sent if counts[n] != 1] == [], counts
    await add_workers(stack)
