"""The whole pipeline through the console platform, on a real broker and a real Redis.

Each test uses its own chats; the simulator's agent is steered by `[sim:…]` directives.
"""

from __future__ import annotations

import asyncio

import httpx
import redis.asyncio as aioredis

from pipeline.stack import Stack

from .console import ConsoleClient, texts

pytestmark = [__import__("pytest").mark.integration]


async def test_private_message_gets_exactly_one_reply(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "hello there")
    await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert texts(got) == ["echo: hello there"]
    assert got[0]["kind"] == "reply"


async def test_group_mention_replies_and_untriggered_message_lands_in_context(
    console: ConsoleClient, stack: Stack
) -> None:
    chat = console.chat("group")
    await console.send(chat, "just chatting", chat_type="group", user_id="u7", user_name="Quiet")
    await console.send(chat, "hi bot", chat_type="group", user_id="u8", user_name="Cy", mentions=["bot"])
    await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert len(got) == 1
    assert texts(got)[0].startswith("echo: ") and "hi bot" in texts(got)[0]
    settings = stack.settings()
    client = aioredis.from_url(settings.redis_url or "", decode_responses=True)
    try:
        window = await client.lrange(f"{settings.redis_prefix}ctx:console:demo:{chat}", 0, -1)
    finally:
        await client.aclose()
    assert any('"just chatting"' in entry for entry in window)


async def test_untriggered_group_message_gets_no_reply(console: ConsoleClient) -> None:
    chat = console.chat("group")
    await console.send(chat, "nobody asked the bot", chat_type="group")
    # Prove the pipeline is live in this chat, then that the first message produced nothing.
    await console.send(chat, "now you", chat_type="group", mentions=["bot"])
    got = await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert len(got) == 1 and "now you" in texts(got)[0] and "nobody asked" not in texts(got)[0]


async def test_mentions_reach_the_agent_apart_from_the_words_around_them(console: ConsoleClient) -> None:
    """As the page sends them: a chip (`mentions` only) before the text, and a mention typed in it."""
    chat = console.chat("group")
    answer = await console.send(
        chat, "hey there @dave!", chat_type="group", user_id="u9", user_name="Dee", mentions=["bot", "carol", "dave"]
    )
    assert answer["addressed"] is True
    unaddressed = await console.send(chat, "@carol only", chat_type="group", user_id="u9", mentions=["carol"])
    assert unaddressed["addressed"] is False  # the page says "not addressed to the bot"
    await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert len(got) == 1 and "@carol hey there @dave!" in texts(got)[0], texts(got)


async def test_held_messages_are_noted_live_then_merged_or_dropped(console: ConsoleClient) -> None:
    """The notes the page shows on people's messages: held while the bot is busy, then merged into
    one turn (or released alone), or dropped by /stop."""
    chat = console.chat()
    async with console.stream(chat) as live:
        await console.send(chat, "[sim:think=4] first")
        await console.session_started(chat)  # the first turn is running now
        held = [(await console.send(chat, word))["message_id"] for word in ("alpha", "beta")]
        await live.next()  # echo: first
        await live.next()  # the merged turn's reply
        *held_notes, merged = live.notes
        # Held one by one, or both at once when ingest took them in one batch and merged them.
        assert {note["note"] for note in held_notes} == {"held"}
        assert [i for note in held_notes for i in note["message_ids"]] == held
        assert merged == {"note": "merged", "message_ids": held}
    other = console.chat()
    async with console.stream(other) as live:
        await console.send(other, "[sim:think=6] a long task")
        await console.session_started(other)
        waiting = (await console.send(other, "later"))["message_id"]
        await console.send(other, "/stop")
        _, stopped = await live.next(timeout=20)
        assert texts([stopped]) == ["Stopped."]
        assert live.notes == [{"note": "held", "message_ids": [waiting]}, {"note": "dropped", "message_ids": [waiting]}]


async def test_messages_sent_while_running_are_merged_into_one_turn(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:think=4] first")
    await console.session_started(chat)  # the first turn is running now
    for word in ("alpha", "beta", "gamma"):
        await console.send(chat, word)
    await console.wait_for(chat, 2, timeout=40)
    got = await console.settle(chat)
    replies = texts(got)
    assert len(replies) == 2, replies
    assert replies[0] == "echo: first"
    assert [w in replies[1] for w in ("alpha", "beta", "gamma")] == [True, True, True]
    assert replies[1].index("alpha") < replies[1].index("beta") < replies[1].index("gamma")


async def test_stop_interrupts_a_running_turn(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:think=6] a long task")
    await console.session_started(chat)
    await console.send(chat, "/stop")
    got = await console.wait_for(chat, 1, timeout=20)
    got = await console.settle(chat)
    assert texts(got) == ["Stopped."]
    assert got[0]["kind"] == "notice"


async def test_the_worker_is_not_idle_while_a_turn_runs_and_idle_after_it(console: ConsoleClient) -> None:
    """What every "exactly one" check here waits on: `switchboard_worker_idle` is 0 while the agent
    thinks, and 1 once the reply is out and nothing else is in flight."""
    chat = console.chat()
    await console.stack_idle()
    await console.send(chat, "[sim:think=2] take your time")
    seen_busy = False
    async with asyncio.timeout(30):
        while not (got := await console.messages(chat)):
            seen_busy = seen_busy or not await console.worker_idle()
            await asyncio.sleep(0.1)
    assert seen_busy, "the worker said it was idle while the agent was thinking"
    await console.stack_idle()
    assert await console.worker_idle()
    assert texts(got) == ["echo: take your time"]


async def test_tool_confirmation_round_trip_with_authorisation(console: ConsoleClient) -> None:
    chat = console.chat("group")
    await console.send(chat, "[sim:confirm_tool] please", chat_type="group", user_id="starter", mentions=["bot"])
    got = await console.wait_for(chat, 1)
    assert got[0]["kind"] == "confirmation"
    assert "@starter" in texts(got)[0]
    refused = await console.send(chat, "/allow", chat_type="group", user_id="stranger")
    got = await console.wait_for(chat, 2)
    assert got[1]["kind"] == "notice" and "Only" in texts(got)[1]
    # Marked as the refusal of that answer: the page shows it to its sender only.
    assert (got[1]["notes"], got[1]["reply_to"]) == (["refused"], refused["message_id"])
    await console.send(chat, "/allow", chat_type="group", user_id="starter")
    got = await console.wait_for(chat, 3)
    got = await console.settle(chat)
    assert texts(got)[2] == "echo: tool allowed" or texts(got)[2] == "tool allowed"
    assert len(got) == 3


async def test_admin_may_deny_a_confirmation(console: ConsoleClient) -> None:
    """`boss` is in the bot's configured admins; nothing in the request says so."""
    chat = console.chat("group")
    await console.send(chat, "[sim:confirm_tool] please", chat_type="group", user_id="starter", mentions=["bot"])
    await console.wait_for(chat, 1)
    await console.send(chat, "/deny not today", chat_type="group", user_id="boss")
    got = await console.wait_for(chat, 2)
    assert "tool denied" in texts(got)[1] and "not today" in texts(got)[1]


async def test_is_admin_in_the_request_is_ignored(console: ConsoleClient) -> None:
    chat = console.chat("group")
    await console.send(chat, "[sim:confirm_tool] please", chat_type="group", user_id="starter", mentions=["bot"])
    await console.wait_for(chat, 1)
    await console.send(chat, "/allow", chat_type="group", user_id="mallory", is_admin=True)
    got = await console.wait_for(chat, 2)
    assert got[1]["kind"] == "notice" and "Only" in texts(got)[1]
    await console.send(chat, "/allow", chat_type="group", user_id="boss")  # the configured admin may
    got = await console.wait_for(chat, 3)
    assert "tool allowed" in texts(got)[2]


async def test_invalid_reply_is_corrected_once(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:invalid_json] fix me")
    got = await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert texts(got) == ["echo: fix me"] and got[0]["kind"] == "reply"
    assert got[0]["notes"] == ["corrected"]  # the page marks it


async def test_fenced_reply_is_corrected(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:fenced_json] fenced")
    got = await console.wait_for(chat, 1)
    assert texts(got) == ["echo: fenced"]


async def test_uncorrectable_reply_becomes_the_fixed_notice(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:uncorrectable] broken")
    got = await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert len(got) == 1 and got[0]["kind"] == "notice"
    assert texts(got)[0].startswith("Sorry, I could not produce a reply")
    assert "SIM-UNCORRECTABLE" not in texts(got)[0]


async def test_exhausted_retries_give_a_notice_and_the_session_stays_usable(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:error=exhausted] try")
    got = await console.wait_for(chat, 1)
    assert got[0]["kind"] == "notice" and "several retries" in texts(got)[0]
    await console.send(chat, "again")
    got = await console.wait_for(chat, 2)
    assert texts(got)[1] == "echo: again"


async def _session_of(stack: Stack, chat: str) -> str | None:
    return await ConsoleClient(stack).session_of(chat)


async def test_terminal_error_notice_and_next_message_starts_a_new_session(
    console: ConsoleClient, stack: Stack
) -> None:
    chat = console.chat()
    await console.send(chat, "hello")
    await console.wait_for(chat, 1)
    first_session = await _session_of(stack, chat)
    assert first_session
    await console.send(chat, "[sim:error=terminal] boom")
    got = await console.wait_for(chat, 2)
    assert got[1]["kind"] == "notice" and "ended" in texts(got)[1]
    await console.send(chat, "hello again")
    got = await console.wait_for(chat, 3)
    assert texts(got)[2] == "echo: hello again"
    assert await _session_of(stack, chat) not in (None, first_session)


async def test_deleted_session_notice_and_next_message_starts_a_new_session(
    console: ConsoleClient, stack: Stack
) -> None:
    chat = console.chat()
    await console.send(chat, "hello")
    await console.wait_for(chat, 1)
    first_session = await _session_of(stack, chat)
    await console.send(chat, "[sim:delete] go away")
    got = await console.wait_for(chat, 2)
    assert got[1]["kind"] == "notice" and "removed" in texts(got)[1]
    await console.send(chat, "back")
    got = await console.wait_for(chat, 3)
    assert texts(got)[2] == "echo: back"
    assert await _session_of(stack, chat) not in (None, first_session)


async def test_redelivered_webhook_produces_one_reply(console: ConsoleClient) -> None:
    chat = console.chat()
    for _ in range(3):
        await console.send(chat, "only once", message_id="platform-msg-1")
    await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert texts(got) == ["echo: only once"]


async def test_two_hundred_conversations_in_parallel_get_replies_in_order(console: ConsoleClient) -> None:
    chats = [console.chat("par") for _ in range(200)]

    async def converse(chat: str) -> None:
        for i in range(3):
            await console.send(chat, f"message {i}", bot_id="queue")

    await asyncio.gather(*(converse(c) for c in chats))

    # One chat at a time: 200 pollers at once would measure the test client, not the pipeline.
    for chat in chats:
        got = texts(await console.wait_for(chat, 3, timeout=120, bot_id="queue"))
        assert got == [f"echo: message {i}" for i in range(3)], (chat, got)


async def test_bad_webhook_is_rejected_with_400(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        url = stack.workers[0].url
        response = await client.post(f"{url}/webhooks/console/demo", content=b"{not json")
        assert response.status_code == 400
        response = await client.post(f"{url}/webhooks/console/nobody", json={})
        assert response.status_code == 404
        metrics = (await client.get(f"{url}/metrics")).text
    assert 'switchboard_webhooks_total{outcome="malformed",platform="console"}' in metrics


async def test_registered_custom_tool_is_answered_by_switchboard(console: ConsoleClient) -> None:
    chat = console.chat("group")
    await console.send(chat, "earlier words", chat_type="group", user_id="u5", user_name="Eve")
    await console.send(chat, "[sim:custom_tool=im_recent_history] what was said", chat_type="group", mentions=["bot"])
    got = await console.wait_for(chat, 1)
    got = await console.settle(chat)
    assert len(got) == 1
    assert texts(got)[0].startswith("tool result: ") and "earlier words" in texts(got)[0]


async def test_unregistered_custom_tool_gets_an_error_result_not_silence(console: ConsoleClient) -> None:
    chat = console.chat()
    await console.send(chat, "[sim:custom_tool=generate_video] a cat")
    got = await console.wait_for(chat, 1)
    assert texts(got)[0].startswith("tool error: ") and "not available" in texts(got)[0]


async def test_reset_forgets_the_session_and_stop_when_idle_says_so(console: ConsoleClient, stack: Stack) -> None:
    chat = console.chat()
    await console.send(chat, "hello")
    await console.wait_for(chat, 1)
    first_session = await _session_of(stack, chat)
    await console.send(chat, "/reset")
    got = await console.wait_for(chat, 2)
    assert got[1]["kind"] == "notice" and texts(got)[1].startswith("Conversation reset")
    await console.send(chat, "/stop")  # nothing runs: a notice, and nothing sent to the session
    got = await console.wait_for(chat, 3)
    assert texts(got)[2] == "Stopped."
    await console.send(chat, "again")
    got = await console.wait_for(chat, 4)
    assert texts(got)[3] == "echo: again"
    assert await _session_of(stack, chat) not in (None, first_session)


async def test_a_token_bot_streams_each_reply_live_and_refuses_without_its_token(stack: Stack) -> None:
    locked = ConsoleClient(stack, bot_id="locked", token="it-console-token")
    chat = locked.chat("live")
    async with locked.stream(chat) as live:
        assert live.response.status_code == 200
        await locked.send(chat, "first")
        seq, message = await live.next()
        assert (seq, texts([message])) == (1, ["echo: first"])
        await locked.send(chat, "second")
        seq, message = await live.next()
        assert (seq, texts([message])) == (2, ["echo: second"])  # only the new message
    # Reconnecting with the last seq seen gets nothing old; a new delivery arrives.
    async with locked.stream(chat, after=2) as live:
        await locked.send(chat, "third")
        assert texts([(await live.next())[1]]) == ["echo: third"]
    anonymous = ConsoleClient(stack, bot_id="locked")
    async with httpx.AsyncClient(timeout=10) as client:
        for path in ("messages", "stream"):
            r = await client.get(f"{anonymous.url}/console/api/{path}", params={"chat_id": chat, "bot_id": "locked"})
            assert r.status_code == 401
            assert "echo" not in r.text
        r = await client.post(
            f"{anonymous.url}/webhooks/console/locked",
            json={"chat_id": chat, "chat_type": "private", "user_id": "u1", "text": "sneaky"},
        )
        assert r.status_code == 401
    assert texts(await locked.settle(chat)) == ["echo: first", "echo: second", "echo: third"]


async def test_an_open_console_stream_does_not_hold_a_worker_stop(stack: Stack, console: ConsoleClient) -> None:
    """SIGTERM with a console tab open: the worker ends the stream and exits by itself instead of
    waiting on it until it is SIGKILLed. (Last in the module: a second worker joins and leaves.)"""
    worker = await stack.add_worker()
    process = worker._proc  # noqa: SLF001
    assert process is not None
    worker.stop_grace = 30  # above the drain and the web shutdown; a SIGKILL after it is a failure
    try:
        async with console.stream(console.chat("tab"), url=worker.url) as live:
            assert live.response.status_code == 200
            await worker.stop()
            assert await live.rest() == b""  # the stream was ended, not cut
    finally:
        await worker.stop()
        stack.workers.remove(worker)
    assert process.returncode == 0, f"the worker did not exit by itself: {process.returncode}"
