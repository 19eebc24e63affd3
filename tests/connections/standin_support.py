"""What the platform stand-ins of this folder and their tests share: serving an aiohttp app on a
free loopback port, and comparing a long connection's message with the one the webhook path makes
of the same body."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pipeline import metrics
from pipeline.platforms import WebhookRequest, get_platform
from pipeline.records import InboundMessage
from pipeline.settings import BotConfig
from tests.metric_values import current
from tests.platforms.conftest import Seen

# Set when a message is made, not by what it says.
_VOLATILE = {"received_at_ms", "hops", "trace_id"}


@dataclass
class ServedSocket:
    """A WebSocket a stand-in accepted."""

    id: int
    ws: web.WebSocketResponse
    opened: float  # time.monotonic()
    closed: float | None = None


class PeerGone:
    """A socket whose peer died and whose reader has not seen it yet: every write fails."""

    closed = False

    async def send_json(self, message: object) -> None:
        raise ConnectionResetError("Cannot write to closing transport")


async def start_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """`app` served on 127.0.0.1 at a free port: its runner (to clean up) and its http:// base."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def seen(request: web.Request) -> Seen:
    """A request as the platform stand-ins' checkers take it (a JSON body decoded)."""
    body = await request.read()
    return Seen(
        method=request.method,
        path=request.path,
        query=dict(request.query),
        headers={k.lower(): v for k, v in request.headers.items()},
        body=body,
        json=json.loads(body) if body and request.content_type == "application/json" else None,
    )


def webhook_messages(bot: BotConfig, body: dict[str, Any]) -> list[InboundMessage]:
    """What the webhook path's parser makes of the same event body."""
    request = WebhookRequest(headers={}, body=json.dumps(body).encode(), received_at_ms=0)
    return list(get_platform(bot.platform).parse(bot, request).messages)


def same_message(a: InboundMessage, b: InboundMessage) -> bool:
    return a.model_dump(exclude=_VOLATILE) == b.model_dump(exclude=_VOLATILE)


def frames(platform: str, outcome: str) -> float:
    return current(metrics.CONNECTION_FRAMES.labels(platform, outcome))
