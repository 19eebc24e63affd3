"""The single format-correction call (S9, S11, S12).

A stateless chat-completions request carrying only a fixed instruction, the invalid output and the
reply schema (strict `json_schema` response format): no session history, no tools. One attempt, a
deadline (30 s by default), cancellable with the turn. Long replies are sent whole. Errors are
reduced to short reasons; the provider's error text is never passed on.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx

from pipeline.segments.exceptions import CorrectionFailed, ReplyInvalid
from pipeline.segments.models import Reply
from pipeline.segments.schema import response_format
from pipeline.segments.validation import validate_reply

# The only text besides the invalid output: it asks for the format, not for new content.
CORRECTION_INSTRUCTION = (
    "The user message is a chat reply that failed validation against the required JSON Schema. "
    "Rewrite it as one JSON object that matches the schema exactly, keeping its content, order and "
    "ids unchanged. Do not add anything. Output only the JSON object."
)


@dataclass(frozen=True, slots=True)
class CorrectionSettings:
    endpoint_url: str  # full URL, e.g. https://ark.cn-beijing.volces.com/api/v3/chat/completions
    model: str
    api_key: str
    timeout_s: float = 30.0
    max_tokens: int | None = None


def correction_request_body(settings: CorrectionSettings, invalid_text: str) -> dict[str, Any]:
    """The complete request body: no history, no tools, strict json_schema."""
    body: dict[str, Any] = {
        "model": settings.model,
        "messages": [
            {"role": "system", "content": CORRECTION_INSTRUCTION},
            {"role": "user", "content": invalid_text},  # whole, never truncated (S11)
        ],
        "response_format": response_format(),
        "stream": False,
    }
    if settings.max_tokens is not None:
        body["max_tokens"] = settings.max_tokens
    return body


def _content_of(payload: Any) -> str:
    try:
        message = payload["choices"][0]["message"]
    except (KeyError, IndexError, TypeError):
        raise CorrectionFailed("bad_response") from None
    if not isinstance(message, dict):
        raise CorrectionFailed("bad_response")
    if message.get("refusal"):
        raise CorrectionFailed("refused")
    content = message.get("content")
    if not isinstance(content, str):
        raise CorrectionFailed("no_content")
    return content


class Corrector:
    """Makes the one correction call. Build once per endpoint; it owns an `httpx.AsyncClient`."""

    def __init__(self, settings: CorrectionSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.settings = settings
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=httpx.Timeout(settings.timeout_s),
            headers={"Authorization": f"Bearer {settings.api_key}", "Content-Type": "application/json"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Corrector:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def correct_text(self, invalid_text: str) -> str:
        """The provider's corrected text (unvalidated). Raises `CorrectionFailed`; cancellation propagates."""
        body = correction_request_body(self.settings, invalid_text)
        try:
            async with asyncio.timeout(self.settings.timeout_s):
                response = await self._client.post(self.settings.endpoint_url, json=body)
                if response.status_code != 200:
                    raise CorrectionFailed(f"http_{response.status_code}")
                payload = response.json()
        except (TimeoutError, httpx.TimeoutException):
            raise CorrectionFailed("timeout") from None
        except httpx.HTTPError:
            raise CorrectionFailed("transport_error") from None
        except ValueError:  # body is not JSON
            raise CorrectionFailed("bad_response") from None
        return _content_of(payload)

    async def correct(self, invalid_text: str) -> Reply:
        """One correction attempt, validated with the same strict rules; raises `CorrectionFailed`."""
        corrected = await self.correct_text(invalid_text)
        try:
            return validate_reply(corrected)
        except ReplyInvalid as error:
            raise CorrectionFailed(f"still_invalid:{error.reason}") from None
