"""OpenAI-compatible ``POST /chat/completions`` used by the reply-correction call.

The invalid reply is taken from the last user message: the text inside ``<reply>…</reply>`` (or
``<invalid_reply>…</invalid_reply>``) when present, else the whole message. The answer is the first
JSON object in it that has a ``segments`` list (fenced or in prose), else the text wrapped as one text
segment. ``SIM-UNCORRECTABLE`` yields still-invalid output; ``SIM-SLOW-CORRECTION`` sleeps 60 s first.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from aiohttp import web

from pipeline.sim.session import new_id

_TAGGED = re.compile(r"<(invalid_reply|reply)>(.*?)</\1>", re.DOTALL)
SLOW_SECONDS = 60.0


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _segments_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("segments"), list):
            return value
    return None


def correct(invalid_reply: str) -> str:
    if "SIM-UNCORRECTABLE" in invalid_reply:
        return "still not a segments object: SIM-UNCORRECTABLE"
    found = _segments_object(invalid_reply)
    if found is None:
        found = {"segments": [{"type": "text", "data": {"text": invalid_reply.strip()}}]}
    return json.dumps(found, separators=(",", ":"), ensure_ascii=False)


def extract_invalid_reply(messages: list[dict[str, Any]]) -> str:
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    text = _message_text(users[-1]) if users else ""
    tagged = _TAGGED.search(text)
    return tagged.group(2) if tagged else text


async def handle_chat_completions(request: web.Request, api_key: str) -> web.Response:
    if request.headers.get("Authorization") != f"Bearer {api_key}":
        return web.json_response({"error": {"type": "authentication_error", "message": "bad api key"}}, status=401)
    try:
        body = await request.json()
        messages = body["messages"]
        if not isinstance(messages, list):
            raise TypeError("messages must be a list")
    except (ValueError, KeyError, TypeError) as exc:
        return web.json_response({"error": {"type": "invalid_request_error", "message": str(exc)}}, status=400)
    invalid_reply = extract_invalid_reply(messages)
    if "SIM-SLOW-CORRECTION" in invalid_reply:
        await asyncio.sleep(SLOW_SECONDS)
    content = correct(invalid_reply)
    return web.json_response(
        {
            "id": new_id("chatcmpl-"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model", "sim-corrector")),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": len(invalid_reply) // 4,
                "completion_tokens": len(content) // 4,
                "total_tokens": (len(invalid_reply) + len(content)) // 4,
            },
        }
    )
