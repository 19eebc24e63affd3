"""Moderation: the lists (pure) and the hook's contract, against a stand-in hook that checks every
request as the operator's service would (bearer secret, JSON body)."""

from __future__ import annotations

import json

import httpx
import pytest
from pydantic import ValidationError

from pipeline.controls.moderation import ModerationConfig, ModerationHook, ask_hook, moderate_reply

SECRET = "hook-secret-0123456789"


def test_words_match_anywhere_in_any_case_and_patterns_as_regular_expressions() -> None:
    lists = ModerationConfig(words=["Spam", "广告"], patterns=[r"\bbuy\s+now\b"])
    assert lists.matches("no SPAMMING here")  # words match inside others: Chinese has no word boundaries
    assert lists.matches("看看这个广告吧")
    assert lists.matches("please BUY   now")
    assert not lists.matches("buying nowhere")
    assert lists.redact("spam, buy now, spam") == ("***, ***, ***", 3)
    assert not ModerationConfig().lists and not ModerationConfig().matches("anything")


def test_bad_lists_fail_when_the_bots_file_is_loaded() -> None:
    with pytest.raises(ValidationError, match="not a valid regular expression"):
        ModerationConfig(patterns=["(unclosed"])
    with pytest.raises(ValidationError, match="matches the empty text"):
        ModerationConfig(patterns=["x*"])
    with pytest.raises(ValidationError, match="empty word"):
        ModerationConfig(words=[" "])
    with pytest.raises(ValidationError, match="16 characters"):
        ModerationHook(url="https://mod.example/check", secret="short")
    with pytest.raises(ValidationError):
        ModerationHook(url="ftp://mod.example/check", secret=SECRET)


def test_a_reply_is_blocked_or_redacted() -> None:
    texts = ["all fine", "some spam here"]
    blocked = moderate_reply(ModerationConfig(words=["spam"], outbound="block"), texts)
    assert (blocked.blocked, blocked.hits) == (True, 1)
    redacted = moderate_reply(ModerationConfig(words=["spam"], outbound="redact"), texts)
    assert (redacted.blocked, redacted.texts) == (False, ["all fine", "some *** here"])
    off = moderate_reply(ModerationConfig(words=["spam"], outbound="off"), texts)
    assert (off.blocked, off.hits, off.texts) == (False, 0, texts)
    clean = moderate_reply(ModerationConfig(words=["spam"]), ["nothing"])
    assert (clean.blocked, clean.hits) == (False, 0)


def stand_in(answer: httpx.Response | Exception, seen: list[dict[str, object]]) -> httpx.AsyncClient:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {SECRET}":
            return httpx.Response(401, json={"error": "unauthorized"})
        if request.headers.get("content-type") != "application/json":
            return httpx.Response(415)
        seen.append(json.loads(request.content))
        if isinstance(answer, Exception):
            raise answer
        return answer

    return httpx.AsyncClient(transport=httpx.MockTransport(handle))


async def verdict(
    answer: httpx.Response | Exception, on_failure: str = "open", secret: str = SECRET
) -> tuple[str, bool]:
    seen: list[dict[str, object]] = []
    hook = ModerationHook.model_validate(
        {"url": "https://mod.example/check", "secret": secret, "on_failure": on_failure}
    )
    async with stand_in(answer, seen) as client:
        got = await ask_hook(client, hook, platform="console", bot_id="demo", chat_id="g", user_id="u", text="hi")
    if seen:
        assert seen == [{"platform": "console", "bot_id": "demo", "chat_id": "g", "user_id": "u", "text": "hi"}]
    return got.reason, got.allowed


async def test_the_hook_decides_and_a_failure_goes_the_configured_way() -> None:
    assert await verdict(httpx.Response(200, json={"allow": True})) == ("clean", True)
    assert await verdict(httpx.Response(200, json={"allow": False})) == ("hook", False)
    # A failure: an error status, a malformed answer, a timeout, a wrong secret (401).
    for failure in (
        httpx.Response(503),
        httpx.Response(200, json={"allow": "yes"}),
        httpx.Response(200, text="not json"),
        httpx.ReadTimeout("slow"),
    ):
        assert await verdict(failure, "open") == ("hook_failed", True)
        assert await verdict(failure, "closed") == ("hook_failed", False)
    assert await verdict(httpx.Response(200, json={"allow": True}), "closed", "another-secret-0123456") == (
        "hook_failed",
        False,
    )
