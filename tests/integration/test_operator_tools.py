"""`switchboard deadletters` and `switchboard conversation` against a running stack: the real broker
(each of SWITCHBOARD_TEST_BROKERS), a real Redis, the simulator, one worker, and the Telegram and QQ
bot API stand-ins of `tests/platforms` (requests checked as the platforms check them). The commands
run as an operator runs them: `python -m pipeline.cli …` with the worker's settings (environment and
bots file), in a process of their own.

Telegram refuses the replies of three chats until they are dead-lettered, then recovers; a replay
of egress's telegram dead letters delivers each reply exactly once, also when the replay is run
again (at once, while the first is being sent, and after). A QQ group reply whose passive window
had closed is dead-lettered, and the replay reports it instead of sending it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from pipeline.bench.measure import TLS
from pipeline.embedded import RedisServer
from pipeline.kafka import consume_until
from pipeline.stack import Stack
from pipeline.topics import DEADLETTER
from tests.conftest import enabled_brokers
from tests.platforms import test_qqbot as qq_fx
from tests.platforms import test_telegram as telegram_fx

from .platform_standins import StandIns
from .stacks import running_stack, stack_idle
from .test_platforms_e2e import PERMANENT, qq_late_group, tg_private

pytestmark = [pytest.mark.integration]

TG_BOT, QQ_BOT = "tg1", "qb1"


def _bots_toml(standins: StandIns) -> str:
    telegram = telegram_fx.bot_config()
    return "\n".join(
        [
            "[[bots]]",
            f'platform = "telegram"\nbot_id = "{TG_BOT}"\nself_id = "{telegram.self_id}"',
            f'username = "{telegram.username}"\napi_base = "{standins.url("telegram")}"\nlanguage = "en"',
            f'credentials = {{ token = "{telegram_fx.TOKEN}", webhook_secret = "s3cret-token" }}',
            "",
            "[[bots]]",
            f'platform = "qqbot"\nbot_id = "{QQ_BOT}"\nself_id = "{qq_fx.BOT_USER}"',
            f'api_base = "{standins.url("qqbot")}"\nlanguage = "en"',
            f'credentials = {{ app_id = "{qq_fx.APP_ID}", app_secret = "{qq_fx.APP_SECRET}" }}',
        ]
    )


@pytest.fixture(scope="module", params=enabled_brokers())
def broker_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def standins(broker_kind: str) -> Iterator[StandIns]:
    servers = StandIns().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def stack(broker_kind: str, redis_server: RedisServer, standins: StandIns) -> Iterator[Stack]:
    with running_stack(broker_kind, name="ops", bots_toml=_bots_toml(standins), redis_url=redis_server.url) as stack:
        standins.idle = lambda: stack_idle(stack)
        yield stack


@pytest.fixture(autouse=True)
def _standins_saw_only_valid_requests(standins: StandIns) -> Iterator[None]:
    yield
    assert standins.errors == [], "requests the real platform would refuse"


async def switchboard(stack: Stack, *args: str) -> tuple[int, str, str]:
    """The CLI in a process of its own, with the stack's settings (and none of the developer's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")} | stack.env
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def switchboard_json(stack: Stack, *args: str) -> dict[str, Any]:
    code, out, err = await switchboard(stack, *args, "--json")
    assert code == 0, (args, out, err)
    return dict(json.loads(out))


async def dead_letters_of(stack: Stack, stage: str, chats: set[str]) -> list[dict[str, Any]]:
    """Read `im.deadletter` until `stage` dead-lettered something of each of `chats`."""
    letters: list[dict[str, Any]] = []

    def all_there(record: Any) -> bool:
        letter = json.loads(record.value)
        if letter["stage"] == stage and json.loads(letter["record"]).get("chat_id") in chats:
            letters.append(letter)
        return {json.loads(x["record"])["chat_id"] for x in letters} == chats

    await consume_until(stack.env["SWITCHBOARD_KAFKA_BOOTSTRAP"], DEADLETTER, all_there, timeout=60)
    return letters


async def post(stack: Stack, path: str, body: bytes, headers: dict[str, str]) -> None:
    async with httpx.AsyncClient(timeout=30, verify=TLS) as client:
        response = await client.post(f"{stack.workers[0].url}{path}", content=body, headers=headers)
    assert response.status_code == 200, response.text


async def metric(stack: Stack, name: str, labels: str) -> float:
    async with httpx.AsyncClient(timeout=10, verify=TLS) as client:
        text = (await client.get(f"{stack.workers[0].url}/metrics")).text
    prefix = f"{name}{{{labels}}} "
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


async def test_replayed_replies_are_delivered_once_even_when_the_replay_runs_twice(
    stack: Stack, standins: StandIns
) -> None:
    refusal, reason = PERMANENT["telegram"]
    chats: dict[str, str] = {}
    for n in range(1, 4):
        request, chat, _ = tg_private(700 + n, f"while blocked {n}")
        chats[chat] = f"while blocked {n}"
        standins.script("telegram", chat, refusal, sticky=True)  # the platform refuses every send
        await post(stack, f"/webhooks/telegram/{TG_BOT}", request.body, dict(request.headers))
    await dead_letters_of(stack, "egress", set(chats))
    await standins.settle()
    assert not [c for chat in chats for c in standins.delivered("telegram", chat)]
    for chat in chats:
        standins.script("telegram", chat)  # recovered: the checker answers again

    filters = ["--stage", "egress", "--platform", "telegram", *(a for chat in chats for a in ("--chat", chat))]
    listed = await switchboard_json(stack, "deadletters", "list", *filters)
    assert listed["selected"] == 3 and listed["counts"] == [{"stage": "egress", "reason": reason, "count": 3}]
    assert all("record" not in row for row in listed["letters"])  # no bodies unless asked
    assert not [text for text in chats.values() if text in json.dumps(listed)]
    shown = await switchboard_json(stack, "deadletters", "show", listed["letters"][0]["position"])
    assert shown["reason"] == reason and shown["attempts"] == 1 and "Forbidden" in shown["error"]

    dry = await switchboard_json(stack, "deadletters", "replay", *filters)
    assert dry["dry_run"] is True and dry["tally"] == {"replay": 3} and len(dry["would_replay"]) == 3
    await standins.settle()
    assert not [c for chat in chats for c in standins.delivered("telegram", chat)]  # a dry run sends nothing

    replayed_before = await metric(stack, "switchboard_replayed_records_total", 'stage="egress"')
    first, second = await asyncio.gather(
        switchboard_json(stack, "deadletters", "replay", "--yes", "--rate", "20", *filters),
        switchboard_json(stack, "deadletters", "replay", "--yes", "--rate", "20", *filters),
    )
    # Whichever came first produced all three; the other produced those not yet delivered when it
    # looked (egress drops those by their outbound ids), and reported the rest as delivered.
    for run in (first, second):
        assert run["dry_run"] is False and len(run["replayed"]) + run["tally"].get("already_delivered", 0) == 3
    assert max(len(first["replayed"]), len(second["replayed"])) == 3
    produced = len(first["replayed"]) + len(second["replayed"])
    for chat in chats:
        await standins.wait_for("telegram", chat)
    await standins.settle()
    for chat, text in chats.items():
        [delivered] = standins.delivered("telegram", chat)  # exactly once, though produced up to twice
        assert delivered.body["text"] == f"echo: {text}"
    replayed = await metric(stack, "switchboard_replayed_records_total", 'stage="egress"') - replayed_before
    assert replayed == produced  # each replayed record counted once by the stage that read it

    # Run again once everything is delivered: reported as delivered, nothing produced.
    third = await switchboard_json(stack, "deadletters", "replay", "--yes", *filters)
    assert third["replayed"] == [] and third["tally"] == {"already_delivered": 3}
    await standins.settle()
    assert all(len(standins.delivered("telegram", chat)) == 1 for chat in chats)

    # The conversation: its session, and its last reply delivered (the replayed copy).
    chat = next(iter(chats))
    by_chat = await switchboard_json(stack, "conversation", "--platform", "telegram", "--bot", TG_BOT, "--chat", chat)
    assert by_chat["conversation"] == f"telegram:{TG_BOT}:{chat}" and by_chat["session"]
    assert by_chat["status"] == "idle" and by_chat["turns_in_flight"] == [] and by_chat["held"] == []
    last = by_chat["last_delivered"]
    assert last is not None and last["delivered"] is True and last["kind"] == "reply" and "replayed" in last
    assert chats[chat] not in json.dumps(by_chat)  # no message text unless asked
    by_session = await switchboard_json(stack, "conversation", "--session", by_chat["session"])
    assert by_session["conversation"] == by_chat["conversation"]
    with_bodies = await switchboard_json(stack, "conversation", "--session", by_chat["session"], "--bodies")
    assert chats[chat] in json.dumps(with_bodies)


async def test_a_reply_past_its_platforms_window_is_reported_not_sent(stack: Stack, standins: StandIns) -> None:
    # A QQ group message delivered 296 s after it was sent: egress stops passive replies 290 s
    # after it, so the reply is dead-lettered (the bot sends no active messages).
    payload, chat, message_id, sent = qq_late_group(9001, "too late for qq", age=296)
    standins.qq.received(message_id, at=sent)
    request = qq_fx.signed(payload)
    await post(stack, f"/webhooks/qqbot/{QQ_BOT}", request.body, dict(request.headers))
    letters = await dead_letters_of(stack, "egress", {chat})
    await standins.settle()
    assert {letter["reason"] for letter in letters} == {"passive_window_expired"}

    filters = ["--stage", "egress", "--platform", "qqbot", "--chat", chat]
    result = await switchboard_json(stack, "deadletters", "replay", "--yes", *filters)
    assert result["replayed"] == [] and set(result["tally"]) == {"past_reply_window"}
    assert all("reply window closed at" in row["detail"] for row in result["skipped"])
    await standins.settle()
    assert standins.calls_for("qqbot", chat) == []  # nothing was ever sent to the chat
    # The text report says so too.
    code, out, _ = await switchboard(stack, "deadletters", "replay", *filters)
    assert code == 0 and "past_reply_window" in out and "would replay 0" in out
