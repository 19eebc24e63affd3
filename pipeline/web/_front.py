"""What a request from a platform meets before the app: the webhook front.

aiohttp's parser (llhttp) has read the request; the front only decides. With
`web_webhook_front` on, a webhook (`POST`/`GET /webhooks/<platform>/<bot>`) is answered here,
without the app's router and per-request app machinery; everything else goes to the app's routes.

Headers are handed to platform code as text it can compare: aiohttp decodes header bytes above
0x7F as UTF-8 with surrogate escapes, which no signature, token or timestamp can be, and which
string comparisons (`hmac.compare_digest` among them) refuse. So a request to a webhook or to the
OneBot WebSocket endpoint whose header values or decoded query hold anything beyond ASCII is
refused with 400 (`bad_header`, `bad_query`) before any verifier runs, counted like the route's
other refusals. Platforms send only ASCII there (signatures, timestamps, tokens, ids).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

WEBHOOK_PREFIX = "/webhooks/"
ONEBOT_WS_PREFIX = "/onebot/ws/"
WEBHOOK_METHODS = frozenset({"POST", "GET"})


@dataclass(frozen=True)
class Reply:
    """What a webhook is answered, through the front or through the app's route."""

    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, value: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Reply:
        return cls(status, json.dumps(value).encode(), headers=headers or {})

    def response(self) -> web.Response:
        headers = {**self.headers, "Content-Type": self.content_type}
        return web.Response(body=self.body, status=self.status, headers=headers)


def webhook_target(path: str) -> tuple[str, str] | None:
    """(platform, bot id) of a webhook path, or None: the app's to route (or refuse)."""
    parts = path.split("/")
    if len(parts) != 4 or not parts[2] or not parts[3]:
        return None
    return parts[2], parts[3]


def header_problem(request: web.BaseRequest) -> str | None:
    """Why the request's headers or query cannot be handed to platform code, or None."""
    if not all(value.isascii() for _, value in request.raw_headers):
        return "bad_header"
    if request.query_string and not all(k.isascii() and v.isascii() for k, v in request.query.items()):
        return "bad_query"
    return None
