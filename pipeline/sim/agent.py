"""The scripted agent: one turn per user.message, steered by ``[sim:…]`` directives.

Default reply: ``{"segments":[{"type":"text","data":{"text":"echo: <T>"}}]}`` where T is the message
text with directives removed. Tool outcomes (``confirm_tool``, ``custom_tool``) replace ``echo: <T>``
as the segment text ("tool allowed", "tool denied" or "tool denied: <reason>", "tool result: <text>",
"tool error: <text>"), one line per tool.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from typing import Any

from pipeline.sim.directives import Directives, parse_directives
from pipeline.sim.session import SimSession, new_id, text_blocks

SUBAGENT_NAME = "researcher"


def im_reply(text: str) -> str:
    return json.dumps(
        {"segments": [{"type": "text", "data": {"text": text}}]}, separators=(",", ":"), ensure_ascii=False
    )


def _without_braces(text: str) -> str:
    # Prose replies must not contain anything a JSON-object extractor could pick up.
    return text.replace("{", "(").replace("}", ")")


def reply_body(directives: Directives, segment_text: str) -> str:
    """The agent.message text for this turn, valid or deliberately broken per the directives."""
    if directives.has("reply"):
        return directives.get("reply")
    if directives.has("invalid_json"):
        return _without_braces(segment_text)
    if directives.has("uncorrectable"):
        return f"SIM-UNCORRECTABLE {_without_braces(segment_text)}"
    if directives.has("long"):
        length = max(int(directives.number("long", 0)), 0)
        filler = (segment_text + " ") if segment_text.strip() else "x"
        segment_text = (filler * (length // len(filler) + 1))[:length]
    valid = im_reply(segment_text)
    if directives.has("fenced_json"):
        return f"```json\n{valid}\n```"
    return valid


def _answer_text(kind: str, answer: dict[str, Any]) -> str:
    if kind == "confirm":
        if answer.get("result") == "allow":
            return "tool allowed"
        reason = str(answer.get("deny_message") or "").strip()
        return f"tool denied: {reason}" if reason else "tool denied"
    result_text = "".join(b.get("text", "") for b in answer.get("content") or [] if b.get("type") == "text")
    return f"tool error: {result_text}" if answer.get("is_error") else f"tool result: {result_text}"


async def _wait_for_actions(session: SimSession, action_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Idle with requires_action until every id is answered; a partial answer re-idles with the rest."""
    session.pending_actions = dict.fromkeys(action_ids)
    session.span_end()
    while True:
        remaining = [i for i in action_ids if session.pending_actions.get(i) is None]
        if not remaining:
            break
        session.answered.clear()
        session.in_turn = False  # idle: stream drops only count while the agent works
        session.go_idle({"type": "requires_action", "event_ids": remaining})
        await session.answered.wait()
    answers = {i: a for i, a in session.pending_actions.items() if a is not None}
    session.pending_actions = {}
    session.in_turn = True
    session.set_running()
    session.span_start()
    return answers


async def _stream_previews(session: SimSession, message_id: str, body: str) -> None:
    chunk = max(session.context.settings.delta_chunk, 1)
    session.preview("event_start", {"event": {"type": "agent.message", "id": message_id}}, "agent.message")
    for start in range(0, len(body), chunk):
        session.preview(
            "event_delta",
            {
                "event_id": message_id,
                "delta": {
                    "type": "content_delta",
                    "index": 0,
                    "content": {"type": "text", "text": body[start : start + chunk]},
                },
            },
            "agent.message",
        )
        await asyncio.sleep(0)  # let the streams interleave, as a real token stream would


def _run_subagent(session: SimSession, task_text: str) -> str:
    thread_id = new_id("sthr-")
    session.emit("session.thread_created", {"agent_name": SUBAGENT_NAME, "session_thread_id": thread_id})
    session.emit(
        "agent.thread_message_sent",
        {
            "content": text_blocks(f"research: {task_text}"),
            "to_session_thread_id": thread_id,
            "to_agent_name": SUBAGENT_NAME,
        },
    )
    session.emit("session.thread_status_running", {"agent_name": SUBAGENT_NAME, "session_thread_id": thread_id})
    # The sub-thread's thinking, replies and spans exist only on the thread itself (P7): not emitted here.
    session.context.stats["subthread_hidden_events"] += 4
    return thread_id


def _finish_subagent(session: SimSession, thread_id: str, task_text: str) -> None:
    session.emit(
        "agent.thread_message_received",
        {
            "content": text_blocks(f"notes on: {task_text}"),
            "from_session_thread_id": thread_id,
            "from_agent_name": SUBAGENT_NAME,
        },
    )
    session.emit(
        "session.thread_status_idle",
        {"agent_name": SUBAGENT_NAME, "session_thread_id": thread_id, "stop_reason": {"type": "end_turn"}},
    )


def media_summary(message: dict[str, Any]) -> str:
    """`[sim:media]`: what the user.message's media blocks carried (type, media type, and the
    first 16 hex digits of the bytes' SHA-256), so a test can see the session got them whole."""
    seen = []
    for block in message.get("content") or []:
        if not isinstance(block, dict) or block.get("type") == "text":
            continue
        given = block.get("source")
        source: dict[str, Any] = given if isinstance(given, dict) else {}
        kind = source.get("type")
        if kind == "base64":
            data = base64.b64decode(str(source.get("data", "")))
            seen.append(
                f"{block.get('type')} {source.get('media_type')} sha256:{hashlib.sha256(data).hexdigest()[:16]}"
            )
        elif kind == "text":
            text = str(source.get("data", "")).encode()
            seen.append(f"{block.get('type')} text sha256:{hashlib.sha256(text).hexdigest()[:16]}")
        else:
            seen.append(f"{block.get('type')} {kind}")
    return "; ".join(seen) or "no media"


async def run_turn(session: SimSession, message: dict[str, Any]) -> None:
    texts = [b.get("text", "") for b in message.get("content") or [] if b.get("type") == "text"]
    directives = parse_directives(texts)
    task_text = directives.text
    settings = session.context.settings
    session.set_running()
    think = directives.number("think", settings.think)
    if think > 0:
        await asyncio.sleep(think)

    if directives.has("error"):
        retry_status = directives.get("error") or "retrying"
        session.emit(
            "session.error",
            {
                "error": {
                    "type": "model_overloaded_error",
                    "message": f"simulated error ({retry_status})",
                    "retry_status": {"type": retry_status},
                }
            },
        )
        if retry_status == "exhausted":
            session.go_idle({"type": "retries_exhausted"})
            return
        if retry_status == "terminal":
            session.terminate()
            return
    if directives.has("terminate"):
        session.terminate()
        return
    if directives.has("delete"):
        session.delete()
        return

    session.span_start()

    if directives.has("progress"):
        session.emit("agent.message", {"content": text_blocks("Working on it, looking a few things up.")})
        session.span_end()
        tool_use = session.emit(
            "agent.tool_use",
            {"name": "web_search", "input": {"query": task_text}, "evaluated_permission": "allow"},
        )
        session.usage.web_search_requests += 1
        session.emit(
            "agent.tool_result",
            {"tool_use_id": tool_use["id"], "content": text_blocks("3 results found"), "is_error": False},
        )
        session.span_start()

    subthread = _run_subagent(session, task_text) if directives.has("subagent") else None

    actions: list[tuple[str, str]] = []
    confirm_count = int(directives.number("confirm_tool", 1)) if directives.has("confirm_tool") else 0
    for n in range(confirm_count):
        tool_use = session.emit(
            "agent.tool_use",
            {"name": "bash", "input": {"command": f"echo step {n + 1}"}, "evaluated_permission": "ask"},
        )
        actions.append(("confirm", tool_use["id"]))
    if directives.has("custom_tool"):
        custom = session.emit(
            "agent.custom_tool_use",
            {"name": directives.get("custom_tool") or "custom_tool", "input": {"query": task_text}},
            thread_id=subthread,  # a sub-agent's custom tool call surfaces with its thread id (P7/P8)
        )
        actions.append(("custom", custom["id"]))

    outcomes: list[str] = []
    if actions:
        answers = await _wait_for_actions(session, [action_id for _, action_id in actions])
        outcomes = [_answer_text(kind, answers[action_id]) for kind, action_id in actions]

    if subthread is not None:
        _finish_subagent(session, subthread, task_text)

    echo = f"echo: {task_text}" + (f" | {media_summary(message)}" if directives.has("media") else "")
    body = reply_body(directives, "\n".join(outcomes) if outcomes else echo)
    message_id = new_id()
    if directives.has("deltas"):
        await _stream_previews(session, message_id, body)
    session.emit("agent.message", {"content": text_blocks(body)}, event_id=message_id)
    usage = directives.usage()  # chosen counts (`[sim:usage=…]`), to try budgets with
    session.usage.cache_read_input_tokens += int(usage.get("cache_read", 0))
    session.usage.active_seconds += usage.get("active", 0.0)
    session.span_end(
        input_tokens=int(usage.get("input", 10 + len(task_text) // 4)),
        output_tokens=int(usage.get("output", 1 + len(body) // 4)),
    )
    session.context.stats["turns_completed"] += 1
    session.go_idle({"type": "end_turn"})
