"""Matrix's application-service transport on a worker's web server, against the stand-in
homeserver (`tests/connections/matrix_standin.py`: events built by mautrix, transactions pushed as
Synapse pushes them, every client-server call checked as Synapse checks an application service's):
transactions become the messages the `/sync` holder makes of the same events; a transaction sent
again is answered and produces nothing; the `hs_token` is checked before the body is read; the
spec's other paths and errors."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from pipeline.records import InboundMessage
from pipeline.settings import BotConfig
from pipeline.topics import DEADLETTER, IM_INBOUND
from tests.connections.matrix_standin import AS_TOKEN, BOT_USER, HS_TOKEN, SERVER, Homeserver

from .conftest import StartWorker, Worker
from .rawhttp import connect, read_until_closed

GROUP, DIRECT, PAIR, SECRET = (f"!{name}:{SERVER}" for name in ("group", "direct", "pair", "secret"))
ALICE, CAROL, DAVE = f"@alice:{SERVER}", f"@carol:{SERVER}", f"@dave:{SERVER}"
BOT_ID = "mxas"


def appservice_bot(api_base: str, **extra: Any) -> BotConfig:
    return BotConfig(
        platform="matrix",
        bot_id=BOT_ID,
        self_id=BOT_USER,
        transport="appservice",
        api_base=api_base,
        language="en",
        credentials={"hs_token": HS_TOKEN, "as_token": AS_TOKEN},
        **extra,
    )


@pytest.fixture
async def homeserver() -> AsyncIterator[Homeserver]:
    server = Homeserver()
    server.add_room(GROUP, [ALICE, f"@bob:{SERVER}"])
    server.add_room(DIRECT, [CAROL, f"@erin:{SERVER}"], direct_with=CAROL)  # direct by m.direct alone
    server.add_room(PAIR, [DAVE])
    server.add_room(SECRET, [ALICE, CAROL])
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def worker(start_worker: StartWorker, homeserver: Homeserver) -> Worker:
    started = await start_worker(bots=[appservice_bot(homeserver.url)], console_enabled=False)
    homeserver.appservice_url = f"{started.url}/webhooks/matrix/{BOT_ID}"
    return started


def inbound(worker: Worker) -> list[InboundMessage]:
    return [InboundMessage.model_validate_json(v) for v in worker.produced.on(IM_INBOUND)]


def counted(outcome: str) -> float:
    labels = {"platform": "matrix", "outcome": outcome}
    return REGISTRY.get_sample_value("switchboard_webhooks_total", labels) or 0.0


async def test_a_transaction_is_mapped_as_sync_maps_it_and_a_retried_one_produces_nothing(
    worker: Worker, homeserver: Homeserver
) -> None:
    bot_said = homeserver.text_event(GROUP, BOT_USER, "an earlier answer")
    homeserver.events[bot_said["event_id"]] = bot_said
    member = homeserver.member_event(GROUP, ALICE)
    mention = homeserver.text_event(GROUP, ALICE, "hello room", mention=True)
    context = homeserver.text_event(GROUP, ALICE, "just chatting")
    reply = homeserver.text_event(GROUP, ALICE, "and then?", reply_to=bot_said["event_id"])
    direct = homeserver.text_event(DIRECT, CAROL, "hello privately")
    pair = homeserver.text_event(PAIR, DAVE, "hello pair")
    own = homeserver.text_event(GROUP, BOT_USER, "the bot's own")
    redelivered = counted("redelivered")

    txn, status, answer = await homeserver.push([member, mention, context, reply, direct, pair, own])
    assert (status, answer) == (200, {})
    _, status, answer = await homeserver.push([member, mention, context, reply, direct, pair, own], txn_id=txn)
    assert (status, answer) == (200, {})  # the homeserver's retry: answered, nothing produced
    assert counted("redelivered") == redelivered + 1

    messages = {m.message_id: m for m in inbound(worker)}
    assert len(inbound(worker)) == 5 and own["event_id"] not in messages
    in_group = messages[mention["event_id"]]
    assert in_group.chat_id == GROUP and in_group.chat_type == "group" and in_group.mentions_bot
    assert in_group.sender.name == "User alice"  # the member event of the same transaction
    assert not messages[context["event_id"]].mentions_bot
    replied = messages[reply["event_id"]]
    assert replied.reply_to is not None and replied.reply_to.is_bot  # looked up with the as_token
    assert messages[direct["event_id"]].chat_type == "private"  # in the bot's m.direct
    assert messages[pair["event_id"]].chat_type == "private"  # two joined members
    assert messages[pair["event_id"]].sender.name == "User dave"  # no member event came: looked up
    # The same events in a new transaction (one another worker might have taken): the same
    # messages again, with the same event ids ingest de-duplicates by.
    await homeserver.push([mention, direct])
    again = inbound(worker)[5:]
    assert [(m.message_id, m.event_id) for m in again] == [
        (mention["event_id"], mention["event_id"]),
        (direct["event_id"], direct["event_id"]),
    ]
    # Lookups were made as the bot's user through the application service's token.
    assert homeserver.requests[f"GET /_matrix/client/v3/user/{BOT_USER}/account_data/m.direct"] == 1
    assert homeserver.requests[f"GET /_matrix/client/v3/rooms/{PAIR}/joined_members"] == 1
    assert homeserver.requests[f"GET /_matrix/client/v3/rooms/{PAIR}/state/m.room.member/{DAVE}"] == 1
    assert homeserver.requests[f"GET /_matrix/client/v3/rooms/{GROUP}/state/m.room.member/{ALICE}"] == 0
    assert homeserver.errors == []


async def test_an_encrypted_event_gets_the_notice_once_sent_as_the_bot(worker: Worker, homeserver: Homeserver) -> None:
    before = REGISTRY.get_sample_value(
        "switchboard_connection_frames_total", {"platform": "matrix", "outcome": "encrypted"}
    )
    for _ in range(2):
        _, status, _ = await homeserver.push([homeserver.encrypted_event(SECRET, ALICE)])
        assert status == 200
    [told] = homeserver.sent_to(SECRET)
    assert told.content["msgtype"] == "m.notice" and "encrypted" in told.content["body"]
    assert homeserver.events[told.event_id]["sender"] == BOT_USER  # masqueraded: the bot, not the sender
    after = REGISTRY.get_sample_value(
        "switchboard_connection_frames_total", {"platform": "matrix", "outcome": "encrypted"}
    )
    assert after == (before or 0.0) + 2
    assert inbound(worker) == [] and homeserver.errors == []


@pytest.mark.parametrize(
    ("headers", "query", "status", "errcode", "outcome"),
    [
        ({}, "", 401, "M_UNAUTHORIZED", "missing_token"),
        ({}, f"?access_token={HS_TOKEN}", 401, "M_UNAUTHORIZED", "missing_token"),  # legacy alone: refused
        ({"Authorization": "Bearer not-the-hs-token"}, "", 403, "M_FORBIDDEN", "bad_token"),
        ({"Authorization": f"Bearer {AS_TOKEN}"}, "", 403, "M_FORBIDDEN", "bad_token"),
        ({"Authorization": f"Basic {HS_TOKEN}"}, "", 403, "M_FORBIDDEN", "bad_token"),
        ({"Authorization": f"Bearer {HS_TOKEN}"}, "?access_token=other", 403, "M_FORBIDDEN", "bad_token"),
    ],
)
async def test_a_missing_or_wrong_hs_token_is_refused_and_produces_nothing(
    worker: Worker,
    homeserver: Homeserver,
    headers: dict[str, str],
    query: str,
    status: int,
    errcode: str,
    outcome: str,
) -> None:
    event = homeserver.text_event(PAIR, DAVE, "forged")
    before = counted(outcome)
    async with httpx.AsyncClient() as client:
        response = await client.put(
            f"{homeserver.appservice_url}/_matrix/app/v1/transactions/forged1{query}",
            json={"events": [event]},
            headers=headers,
        )
    assert response.status_code == status and response.json()["errcode"] == errcode
    assert counted(outcome) == before + 1
    # The same transaction id with the right token afterwards is taken: the refusal left no trace.
    _, ok, _ = await homeserver.push([event], txn_id="forged1")
    assert ok == 200
    assert [m.text for m in inbound(worker)] == ["forged"]
    assert homeserver.requests.total() == 3  # the genuine one's lookups: m.direct, members, the name


async def test_the_token_is_checked_before_the_body_is_read(worker: Worker) -> None:
    reader, writer = await connect(worker)
    # A body announced and never sent: a server that read it first would wait for it.
    writer.write(
        f"PUT /webhooks/matrix/{BOT_ID}/_matrix/app/v1/transactions/9 HTTP/1.1\r\nHost: x\r\n"
        "Authorization: Bearer wrong\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"
        "Connection: close\r\n\r\n".encode()
    )
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=30)
    assert head.startswith(b"HTTP/1.1 403 "), head
    writer.close()
    await read_until_closed(reader, 30)


async def test_the_spec_s_other_paths(worker: Worker, homeserver: Homeserver) -> None:
    base = homeserver.appservice_url
    auth = {"Authorization": f"Bearer {HS_TOKEN}"}
    async with httpx.AsyncClient() as client:
        ping = await client.post(f"{base}/_matrix/app/v1/ping", json={"transaction_id": "t1"}, headers=auth)
        user = await client.get(f"{base}/_matrix/app/v1/users/%40someone%3A{SERVER}", headers=auth)
        room = await client.get(f"{base}/_matrix/app/v1/rooms/%23alias%3A{SERVER}", headers=auth)
        unknown = await client.get(f"{base}/_matrix/app/v1/thirdparty/protocol/irc", headers=auth)
        legacy = await client.put(f"{base}/transactions/5", json={"events": []}, headers=auth)
        wrong_method = await client.get(f"{base}/_matrix/app/v1/transactions/5", headers=auth)
        not_appservice = await client.put(
            f"{base.replace(BOT_ID, 'nobody')}/_matrix/app/v1/transactions/5", json={"events": []}, headers=auth
        )
        unauthenticated_unknown = await client.get(f"{base}/_matrix/app/v1/thirdparty/protocol/irc")
    assert (ping.status_code, ping.json()) == (200, {})
    assert user.status_code == room.status_code == 404
    assert user.json()["errcode"] == room.json()["errcode"] == "M_NOT_FOUND"
    for response in (unknown, legacy, not_appservice):
        assert response.status_code == 404 and response.json()["errcode"] == "M_UNRECOGNIZED", response.text
    assert wrong_method.status_code == 405 and wrong_method.json()["errcode"] == "M_UNRECOGNIZED"
    assert unauthenticated_unknown.status_code == 401  # nothing is said about paths without the token


async def test_a_malformed_transaction_is_a_400_and_a_dead_letter(worker: Worker, homeserver: Homeserver) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.put(
            f"{homeserver.appservice_url}/_matrix/app/v1/transactions/bad1",
            content=b'{"not_events": []}',
            headers={"Authorization": f"Bearer {HS_TOKEN}"},
        )
    assert response.status_code == 400 and response.json()["errcode"] == "M_BAD_JSON"
    [letter] = [json.loads(v) for v in worker.produced.on(DEADLETTER)]
    assert letter["reason"] == "malformed_payload" and letter["stage"] == "ingress"
    assert inbound(worker) == []


async def test_a_transaction_whose_lookups_failed_is_refused_and_taken_when_sent_again(
    worker: Worker, homeserver: Homeserver
) -> None:
    event = homeserver.text_event(PAIR, DAVE, "while the homeserver struggles")
    homeserver.unavailable = True
    txn, status, answer = await homeserver.push([event])
    assert status == 503 and answer["errcode"] == "M_UNKNOWN"  # the homeserver sends it again later
    assert inbound(worker) == []
    homeserver.unavailable = False
    assert (await homeserver.push([event], txn_id=txn))[1] == 200  # not taken for a finished one
    assert [m.message_id for m in inbound(worker)] == [event["event_id"]]
