"""What ingress refuses, over real HTTP to the worker's web app: the status the platform gets, the
`switchboard_webhooks_total` outcome it is counted under, and that nothing reaches `im.inbound`.
The app's producer seam records what it would send to the broker."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from pipeline.platforms import WebhookRequest
from pipeline.records import MAX_ID_CHARS
from pipeline.settings import Settings
from pipeline.stages.outputs import Outputs
from pipeline.topics import DEADLETTER, IM_INBOUND
from pipeline.web import WebDeps, build_web_app
from pipeline.web._guard import GuardedAppRunner
from pipeline.web.server import front_site

from . import test_lark as lark_fx
from . import test_onebot as onebot_fx
from . import test_qqbot as qq_fx
from . import test_slack as slack_fx
from . import test_telegram as telegram_fx
from . import test_wecom as wecom_fx


@dataclass
class Produced:
    records: list[tuple[str, str | None, bytes]] = field(default_factory=list)

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, key, value))

    def on(self, topic: str) -> list[bytes]:
        return [v for t, _, v in self.records if t == topic]


@dataclass
class Ingress:
    url: str
    produced: Produced

    async def post(self, platform: str, bot_id: str, request: WebhookRequest) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.post(
                f"{self.url}/webhooks/{platform}/{bot_id}", content=request.body, headers=dict(request.headers)
            )


@pytest.fixture(params=["front", "aiohttp"])
async def ingress(redis_url: str, redis_prefix: str, request: pytest.FixtureRequest) -> AsyncIterator[Ingress]:
    """The worker's web app, its webhooks answered by the webhook front or by aiohttp's route."""
    settings = Settings(
        redis_prefix=redis_prefix,
        bots=[
            lark_fx.bot_config(),
            slack_fx.bot_config(),
            telegram_fx.bot_config(),
            onebot_fx.bot_config(),
            wecom_fx.bot_config(),
            qq_fx.bot_config(),
        ],
    )
    produced = Produced()

    async def ready() -> dict[str, bool]:
        return {"started": True}

    deps = WebDeps(
        settings=settings,
        produce=produced,
        outputs=Outputs(produced),
        ready=ready,
    )
    runner = GuardedAppRunner(build_web_app(deps), max_connections=100, request_timeout=10.0)
    await runner.setup()
    site: web.BaseSite
    if request.param == "front":
        site = front_site(runner, deps, "127.0.0.1", 0)
    else:
        site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield Ingress(f"http://127.0.0.1:{runner.addresses[0][1]}", produced)
    finally:
        await runner.cleanup()


def counted(platform: str, outcome: str) -> float:
    value = REGISTRY.get_sample_value("switchboard_webhooks_total", {"platform": platform, "outcome": outcome})
    return value or 0.0


async def test_a_recorded_lark_request_is_refused_after_the_window(ingress: Ingress) -> None:
    event = lark_fx.receive_event("text", {"text": "hi"}, chat_type="p2p")
    before = counted("lark", "stale_timestamp")
    response = await ingress.post("lark", "lk1", lark_fx.encrypted_request(event, sent_at=int(time.time()) - 3600))
    assert response.status_code == 401 and response.json() == {"error": "stale_timestamp"}
    assert counted("lark", "stale_timestamp") == before + 1
    assert ingress.produced.records == []  # not even a dead letter: an unauthenticated body is not kept
    # The same event, sent now, goes through.
    response = await ingress.post("lark", "lk1", lark_fx.encrypted_request(event))
    assert response.status_code == 200 and len(ingress.produced.on(IM_INBOUND)) == 1


@pytest.mark.parametrize("which", ["chat", "user", "message"])
async def test_an_over_long_id_is_refused_and_counted(ingress: Ingress, which: str) -> None:
    long_id = "C" + "9" * MAX_ID_CHARS  # one over the bound
    fields = {"chat": "channel", "user": "user", "message": "ts"}
    event = dict(slack_fx.APP_MENTION, **{fields[which]: long_id})
    before = counted("slack", "id_too_long")
    response = await ingress.post("slack", "sl1", slack_fx.signed(slack_fx.callback(event)))
    assert response.status_code == 400
    body = response.json()
    assert body["error"] == "id_too_long" and f"{MAX_ID_CHARS} at most" in body["detail"]
    assert counted("slack", "id_too_long") == before + 1
    assert ingress.produced.on(IM_INBOUND) == []
    [dead] = ingress.produced.on(DEADLETTER)
    assert json.loads(dead)["reason"] == "id_too_long"


async def test_ids_at_the_bound_pass(ingress: Ingress) -> None:
    event = dict(slack_fx.APP_MENTION, channel="C" + "9" * (MAX_ID_CHARS - 1))
    response = await ingress.post("slack", "sl1", slack_fx.signed(slack_fx.callback(event)))
    assert response.status_code == 200 and len(ingress.produced.on(IM_INBOUND)) == 1


async def test_over_long_ids_on_every_platform(ingress: Ingress) -> None:
    long_number = int("9" * (MAX_ID_CHARS + 1))  # JSON numbers have no size limit
    group = onebot_fx.group_event("hi", group_id=long_number)
    assert (await ingress.post("onebot", "qq1", onebot_fx.signed(group))).status_code == 400
    update = telegram_fx.Update(
        9100,
        message=telegram_fx.Message(
            1, telegram_fx.WHEN, telegram_fx.Chat(-long_number, "supergroup"), from_user=telegram_fx.ALICE, text="hi"
        ),
    )
    assert (await ingress.post("telegram", "tg1", telegram_fx.request(update))).status_code == 400
    lark_event = lark_fx.receive_event("text", {"text": "hi"}, event_id="e" * (MAX_ID_CHARS + 1))
    assert (await ingress.post("lark", "lk1", lark_fx.encrypted_request(lark_event))).status_code == 400
    reasons = [json.loads(d)["reason"] for d in ingress.produced.on(DEADLETTER)]
    assert reasons == ["id_too_long"] * 3 and ingress.produced.on(IM_INBOUND) == []


async def test_wecom_url_check_is_a_get_answered_in_plain_text(ingress: Ingress) -> None:
    url = f"{ingress.url}/webhooks/wecom/wc1"
    async with httpx.AsyncClient() as client:
        check = wecom_fx.url_check("1616140317555161061")
        response = await client.get(url, params=dict(check.query))
        assert response.status_code == 200 and response.text == "1616140317555161061"
        assert response.headers["content-type"].startswith("text/plain")
        forged = wecom_fx.url_check("1616140317555161061", token="another-token")
        assert (await client.get(url, params=dict(forged.query))).status_code == 401
        # A message: an empty 200 (no passive reply); a forged one: 401, nothing produced or kept.
        message = wecom_fx.app_request(wecom_fx.app_xml("text", Content="hi"))
        response = await client.post(url, params=dict(message.query), content=message.body)
        assert response.status_code == 200 and response.text == ""
        forged_message = wecom_fx.app_request(wecom_fx.app_xml("text", Content="x", msg_id="2"), token="nope")
        response = await client.post(url, params=dict(forged_message.query), content=forged_message.body)
        assert response.status_code == 401
        # Platforms whose webhooks take only POST refuse a GET.
        before = counted("lark", "method_not_allowed")
        response = await client.get(f"{ingress.url}/webhooks/lark/lk1")
        assert response.status_code == 405 and response.headers["allow"] == "POST"
        assert counted("lark", "method_not_allowed") == before + 1
    [record] = ingress.produced.records
    assert record[0] == IM_INBOUND and json.loads(record[2])["text"] == "hi"


async def test_qqbot_refusals(ingress: Ingress) -> None:
    """A forged, a recorded (stale) and an over-long-id QQ callback: 401, 401 and 400, each counted,
    only the last dead-lettered, nothing produced to im.inbound."""
    before = {o: counted("qqbot", o) for o in ("bad_signature", "stale_timestamp", "id_too_long")}
    forged = qq_fx.signed(qq_fx.c2c("hi"), secret="someone-elses-secret")
    response = await ingress.post("qqbot", "qb1", forged)
    assert response.status_code == 401 and response.json() == {"error": "bad_signature"}
    stale = qq_fx.signed(qq_fx.c2c("hi"), timestamp=int(time.time()) - 600)
    response = await ingress.post("qqbot", "qb1", stale)
    assert response.status_code == 401 and response.json() == {"error": "stale_timestamp"}
    long_group = qq_fx.group_at("hi", group="G" * (MAX_ID_CHARS + 1))
    response = await ingress.post("qqbot", "qb1", qq_fx.signed(long_group))
    assert response.status_code == 400 and response.json()["error"] == "id_too_long"
    for outcome, value in before.items():
        assert counted("qqbot", outcome) == value + 1, outcome
    assert [json.loads(d)["reason"] for d in ingress.produced.on(DEADLETTER)] == ["id_too_long"]
    assert ingress.produced.on(IM_INBOUND) == []
