"""The correction call against a real local HTTP server imitating OpenAI chat-completions (S9, S11, S12)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from pipeline.segments import (
    CorrectionFailed,
    CorrectionSettings,
    Corrector,
    OutcomeReason,
    finalize_reply,
    reply_json_schema,
)
from pipeline.segments.correction import CORRECTION_INSTRUCTION
from pipeline.segments.notices import NoticeKind
from tests.segments.conftest import TURN, make_policy

VALID = '{"segments":[{"type":"text","data":{"text":"fixed"}}]}'
INVALID = '```json\n{"segments":[{"type":"text","data":{"text":"fixed"}}]}\n```'


def completion(content: str | None) -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    }


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class FakeProvider:
    """An OpenAI-compatible endpoint whose behaviour each test sets; records every request."""

    url: str = ""
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    handler: Handler | None = None
    received: asyncio.Event = field(default_factory=asyncio.Event)
    # Set at teardown so slow handlers end and the server shuts down at once.
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def stall(self) -> None:
        await asyncio.wait_for(self.release.wait(), 10)


@pytest.fixture
async def provider() -> AsyncIterator[FakeProvider]:
    state = FakeProvider()

    async def chat_completions(request: web.Request) -> web.StreamResponse:
        state.requests.append(await request.json())
        state.headers.append(dict(request.headers))
        state.received.set()
        assert state.handler is not None
        return await state.handler(request)

    app = web.Application()
    app.router.add_post("/api/v3/chat/completions", chat_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port chosen by the kernel
    await site.start()
    port = runner.addresses[0][1]
    state.url = f"http://127.0.0.1:{port}/api/v3/chat/completions"
    try:
        yield state
    finally:
        state.release.set()
        await runner.cleanup()


def settings(provider: FakeProvider, timeout_s: float = 5.0) -> CorrectionSettings:
    return CorrectionSettings(
        endpoint_url=provider.url, model="doubao-test", api_key="test-key-123456", timeout_s=timeout_s
    )


async def test_success_request_carries_only_invalid_output_and_strict_schema(provider: FakeProvider) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response(completion(VALID))

    provider.handler = ok
    async with Corrector(settings(provider)) as corrector:
        outcome = await finalize_reply(
            INVALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps()
        )
    assert outcome.reason is OutcomeReason.CORRECTED and outcome.corrected
    assert [s.model_dump() for s in outcome.segments] == [{"type": "text", "data": {"text": "fixed"}}]

    assert len(provider.requests) == 1
    body = provider.requests[0]
    assert set(body) <= {"model", "messages", "response_format", "stream", "max_tokens"}
    assert "tools" not in body and "tool_choice" not in body
    assert body["messages"] == [
        {"role": "system", "content": CORRECTION_INSTRUCTION},
        {"role": "user", "content": INVALID},
    ]
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "im_reply", "schema": reply_json_schema(), "strict": True},
    }
    assert provider.headers[0]["Authorization"] == "Bearer test-key-123456"


async def test_long_reply_is_sent_whole(provider: FakeProvider) -> None:
    long_invalid = "Here you go: " + json.dumps({"segments": [{"type": "text", "data": {"text": "z" * 40_000}}]})
    assert len(long_invalid) > 32_000

    async def ok(request: web.Request) -> web.Response:
        return web.json_response(completion(VALID))

    provider.handler = ok
    async with Corrector(settings(provider)) as corrector:
        await corrector.correct(long_invalid)
    assert provider.requests[0]["messages"][1]["content"] == long_invalid


async def test_still_invalid_gives_notice_not_content(provider: FakeProvider) -> None:
    async def still_bad(request: web.Request) -> web.Response:
        return web.json_response(completion('{"segments":[{"type":"mention","data":{"target":123}}]}'))

    provider.handler = still_bad
    async with Corrector(settings(provider)) as corrector:
        outcome = await finalize_reply(
            INVALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps()
        )
    assert outcome.reason is OutcomeReason.CORRECTION_FAILED
    assert outcome.detail.startswith("still_invalid:schema:")
    assert outcome.segments == [] and outcome.notice is not None
    assert outcome.notice.kind is NoticeKind.REPLY_INVALID
    assert len(provider.requests) == 1  # at most one correction call


async def test_timeout_gives_notice(provider: FakeProvider) -> None:
    async def slow(request: web.Request) -> web.Response:
        await provider.stall()
        return web.json_response(completion(VALID))

    provider.handler = slow
    async with Corrector(settings(provider, timeout_s=0.3)) as corrector:
        started = asyncio.get_running_loop().time()
        with pytest.raises(CorrectionFailed) as failure:
            await corrector.correct(INVALID)
        assert asyncio.get_running_loop().time() - started < 2.0
        assert failure.value.reason == "timeout"
        outcome = await finalize_reply(
            INVALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps()
        )
    assert outcome.reason is OutcomeReason.CORRECTION_FAILED and outcome.detail == "timeout"


async def test_cancellation_propagates(provider: FakeProvider) -> None:
    async def slow(request: web.Request) -> web.Response:
        await provider.stall()
        return web.json_response(completion(VALID))

    provider.handler = slow
    async with Corrector(settings(provider)) as corrector:
        task = asyncio.create_task(
            finalize_reply(INVALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps())
        )
        await asyncio.wait_for(provider.received.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()


@pytest.mark.parametrize("status", [500, 429, 401])
async def test_http_error_gives_notice_without_error_text(provider: FakeProvider, status: int) -> None:
    async def failing(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "internal secret detail"}}, status=status)

    provider.handler = failing
    async with Corrector(settings(provider)) as corrector:
        outcome = await finalize_reply(
            INVALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps()
        )
    assert outcome.reason is OutcomeReason.CORRECTION_FAILED and outcome.detail == f"http_{status}"
    assert outcome.notice is not None and "secret detail" not in outcome.notice.text


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"not json", "bad_response"),
        (b'{"choices": []}', "bad_response"),
        (json.dumps(completion(None)).encode(), "no_content"),
    ],
)
async def test_malformed_provider_body(provider: FakeProvider, body: bytes, reason: str) -> None:
    async def weird(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    provider.handler = weird
    async with Corrector(settings(provider)) as corrector:
        with pytest.raises(CorrectionFailed) as failure:
            await corrector.correct(INVALID)
    assert failure.value.reason == reason


async def test_connection_refused_is_a_failure_not_a_crash(provider: FakeProvider) -> None:
    dead = CorrectionSettings(endpoint_url="http://127.0.0.1:9/api/v3/chat/completions", model="m", api_key="k")
    async with Corrector(dead) as corrector:
        with pytest.raises(CorrectionFailed) as failure:
            await corrector.correct(INVALID)
    assert failure.value.reason == "transport_error"


async def test_valid_reply_makes_no_call(provider: FakeProvider) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.json_response(completion(VALID))

    provider.handler = ok
    async with Corrector(settings(provider)) as corrector:
        outcome = await finalize_reply(
            VALID, TURN, make_policy(), corrector=corrector, media=None, capabilities=_caps()
        )
    assert outcome.reason is OutcomeReason.OK and provider.requests == []


def _caps() -> Any:
    from pipeline.segments import Capabilities

    return Capabilities()
