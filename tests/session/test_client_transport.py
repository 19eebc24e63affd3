"""Client logic with httpx.MockTransport: request shape per profile, retries, timeout-then-lookup."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from pipeline.session import (
    AuthError,
    BadRequestError,
    RateLimitedError,
    RetryPolicy,
    SendTimeoutError,
    ServerError,
    SessionClient,
    SystemMessage,
    TextBlock,
    UserInterrupt,
    UserMessage,
    UserToolConfirmation,
)

Handler = Callable[[httpx.Request], httpx.Response]
FAST = RetryPolicy(max_attempts=4, base_delay=0.001, max_delay=0.002)


def client(handler: Handler, profile: str = "ark", **options: Any) -> SessionClient:
    options.setdefault("retry", FAST)
    return SessionClient(
        api_key="k",
        profile=profile,
        base_url="http://sim.test/api/v3",
        transport=httpx.MockTransport(handler),
        **options,
    )


def echo(request: httpx.Request) -> httpx.Response:
    events = json.loads(request.content)["events"]
    return httpx.Response(200, json={"data": [{"id": e.get("id", "sevt-x"), "processed_at": "t", **e} for e in events]})


def message(text: str = "hi", message_id: str | None = "m-1") -> list[Any]:
    return [UserMessage(id=message_id, content=[TextBlock(text=text)]), SystemMessage(content=[TextBlock(text="s")])]


async def test_ark_request_shape() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return echo(request)

    async with client(handler) as c:
        echoed = await c.send("sesn-1", [*message(), UserInterrupt()])
    assert [e.type for e in echoed] == ["user.message", "system.message", "user.interrupt"]
    assert [len(json.loads(r.content)["events"]) for r in seen] == [2, 1]
    assert seen[0].url.path == "/api/v3/sessions/sesn-1/events"
    assert seen[0].headers["authorization"] == "Bearer k"
    assert json.loads(seen[0].content)["events"][0] == {
        "type": "user.message",
        "id": "m-1",
        "content": [{"type": "text", "text": "hi"}],
    }


async def test_anthropic_request_shape_and_empty_answers() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    async with client(handler, "anthropic") as c:
        assert await c.send("s", [*message(), UserInterrupt()]) == []
    assert len(seen) == 1 and len(json.loads(seen[0].content)["events"]) == 3
    assert seen[0].headers["x-api-key"] == "k" and seen[0].headers["anthropic-beta"] == "managed-agents-2026-04-01"


async def test_stable_id_is_assigned_when_missing() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return echo(request)

    async with client(handler) as c:
        await c.send("s", message(message_id=None))
    assert bodies[0]["events"][0]["id"].startswith("sevt-cli-")


async def test_retries_429_honouring_retry_after_then_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr("pipeline.session.client.asyncio.sleep", fake_sleep)
    answers = iter(
        [httpx.Response(429, headers={"retry-after": "1.5"}), httpx.Response(429, headers={"retry-after": "2"})]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers, None) or echo(request)

    async with client(handler) as c:
        echoed = await c.send("s", message())
    assert echoed[0].id == "m-1"
    assert sleeps == [1.5, 2.0]


async def test_gives_up_after_max_attempts() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(429, headers={"retry-after": "0"})

    async with client(handler) as c:
        with pytest.raises(RateLimitedError):
            await c.send("s", [UserInterrupt()])
    assert calls == FAST.max_attempts


async def test_auth_and_bad_request_are_not_retried() -> None:
    for status, error in ((401, AuthError), (400, BadRequestError)):
        calls = 0

        def handler(request: httpx.Request, status: int = status) -> httpx.Response:
            nonlocal calls
            calls += 1
            return httpx.Response(status, json={"error": {"message": "no"}})

        async with client(handler) as c:
            with pytest.raises(error):
                await c.send("s", message())
        assert calls == 1


async def test_connect_errors_are_retried() -> None:
    failures = 2

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal failures
        if failures:
            failures -= 1
            raise httpx.ConnectError("refused", request=request)
        return echo(request)

    async with client(handler) as c:
        assert len(await c.send("s", message())) == 2


def _history_handler(
    history: list[dict[str, Any]], posts: list[Any], post_behaviour: Callable[[httpx.Request], httpx.Response]
) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            data = list(reversed(history)) if request.url.params.get("order") == "desc" else history
            return httpx.Response(200, json={"data": data, "next_page": None})
        posts.append(json.loads(request.content))
        return post_behaviour(request)

    return handler


async def test_timeout_then_found_in_history_is_not_resent() -> None:
    posts: list[Any] = []
    history: list[dict[str, Any]] = []

    def accept_then_time_out(request: httpx.Request) -> httpx.Response:
        events = json.loads(request.content)["events"]
        history.append(
            {"type": "user.message", "id": events[0]["id"], "processed_at": "t", "content": events[0]["content"]}
        )
        history.append(
            {"type": "system.message", "id": "sevt-sys", "processed_at": "t", "content": events[1]["content"]}
        )
        history.append({"type": "session.status_running", "id": "sevt-run", "processed_at": "t"})
        raise httpx.ReadTimeout("slow", request=request)

    async with client(_history_handler(history, posts, accept_then_time_out)) as c:
        echoed = await c.send("s", message())
    assert len(posts) == 1, "a user message was posted twice"
    assert [e.id for e in echoed] == ["m-1", "sevt-sys"]


async def test_timeout_not_in_history_is_resent() -> None:
    posts: list[Any] = []
    history: list[dict[str, Any]] = []
    behaviours = iter(["timeout"])

    def lose_first(request: httpx.Request) -> httpx.Response:
        if next(behaviours, None) == "timeout":
            raise httpx.ReadTimeout("lost", request=request)
        return echo(request)

    async with client(_history_handler(history, posts, lose_first)) as c:
        echoed = await c.send("s", message())
    assert len(posts) == 2 and echoed[0].id == "m-1"


async def test_5xx_after_acceptance_is_looked_up() -> None:
    posts: list[Any] = []
    history: list[dict[str, Any]] = []

    def accept_then_500(request: httpx.Request) -> httpx.Response:
        events = json.loads(request.content)["events"]
        history.append({"type": "user.tool_confirmation", "id": "sevt-c", "processed_at": "t", **events[0]})
        return httpx.Response(502)

    async with client(_history_handler(history, posts, accept_then_500)) as c:
        echoed = await c.send("s", [UserToolConfirmation(result="allow", tool_use_id="sevt-tool")])
    assert len(posts) == 1 and echoed[0].id == "sevt-c"


async def test_timeout_without_delivery_key_raises() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    async with client(handler) as c:
        with pytest.raises(SendTimeoutError):
            await c.send("s", [UserInterrupt()])


async def test_persistent_5xx_raises_server_error() -> None:
    async with client(lambda request: httpx.Response(503)) as c:
        with pytest.raises(ServerError):
            await c.get_session("s")


async def test_list_walks_all_pages_and_skips_to_after_without_native_support() -> None:
    pages = {
        None: {
            "data": [{"type": "session.status_running", "id": "e1"}, {"type": "x.new", "id": "e2"}],
            "next_page": "p2",
        },
        "p2": {"data": [{"type": "session.status_running", "id": "e3"}], "next_page": None},
    }
    params: list[httpx.QueryParams] = []

    def handler(request: httpx.Request) -> httpx.Response:
        params.append(request.url.params)
        return httpx.Response(200, json=pages[request.url.params.get("page")])

    async with client(handler, "anthropic") as c:
        assert [e.id async for e in c.list("s")] == ["e1", "e2", "e3"]
        assert [e.id async for e in c.list("s", after="e1")] == ["e2", "e3"]
    assert "after" not in params[-1]
    async with client(handler, "ark") as c:
        [e async for e in c.list("s", after="e1")]
    assert params[-1]["after"] == "e1"


async def test_conflict_on_own_id_resolves_from_history() -> None:
    posts: list[Any] = []
    history = [
        {"type": "user.message", "id": "m-1", "processed_at": "t", "content": [{"type": "text", "text": "hi"}]},
        {"type": "system.message", "id": "sevt-s", "processed_at": "t", "content": [{"type": "text", "text": "s"}]},
    ]
    async with client(_history_handler(history, posts, lambda request: httpx.Response(409))) as c:
        echoed = await c.send("s", message())
    assert len(posts) == 1 and [e.id for e in echoed] == ["m-1", "sevt-s"]
