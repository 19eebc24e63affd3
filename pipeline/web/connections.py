"""Long connections the platform's side dials: OneBot v11 reverse WebSocket.

`GET /onebot/ws/{bot_id}` takes the universal role (or the role `X-Client-Role` names);
`/onebot/ws/{bot_id}/event` and `/onebot/ws/{bot_id}/api` the split roles of the v11 spec. Only a
bot configured with `transport = "ws-reverse"` has the endpoint (404 otherwise); its `access_token`
is required (401 otherwise, and the token is never logged). The accepted socket is held by this
worker (`Connections.accept`) until it closes or a newer connection elsewhere takes the lease.
"""

from __future__ import annotations

import logging

from aiohttp import web

from pipeline import metrics
from pipeline.connections import Connections
from pipeline.connections.onebot import (
    MAX_FRAME_BYTES,
    PING_SECONDS,
    OneBotSocket,
    Refused,
    reverse_admission,
    reverse_handshake,
)
from pipeline.platforms._common import warn_limited

log = logging.getLogger(__name__)

CONNECTIONS = web.AppKey("connections", Connections)


def add_connection_routes(app: web.Application, connections: Connections) -> None:
    app[CONNECTIONS] = connections
    app.router.add_get("/onebot/ws/{bot_id}", onebot_reverse)
    app.router.add_get("/onebot/ws/{bot_id}/{role:event|api}", onebot_reverse)
    # Accepted sockets live as long as their connection: close them when the server shuts down, so
    # the implementation reconnects (to another worker) at once.
    app.on_shutdown.append(_close_accepted)


async def onebot_reverse(request: web.Request) -> web.StreamResponse:
    connections = request.app[CONNECTIONS]
    bot_id = request.match_info["bot_id"]
    entry = connections.bot("onebot", bot_id)
    if entry is None or entry.bot.transport != "ws-reverse":
        metrics.CONNECTION_HANDSHAKES.labels("onebot", "not_a_connection_bot").inc()
        return web.json_response({"error": "unknown bot"}, status=404)
    bot = entry.bot
    try:
        channels = reverse_handshake(
            bot,
            {k.lower(): v for k, v in request.headers.items()},
            request.query,
            request.match_info.get("role"),
        )
        await reverse_admission(connections.store, bot, channels, request.remote)
    except Refused as exc:
        metrics.CONNECTION_HANDSHAKES.labels("onebot", exc.reason).inc()
        # Anyone can knock: counted always, written to the log once a minute per bot and reason.
        warn_limited(
            f"onebot/{bot_id}/{exc.reason}", "onebot/%s: reverse WebSocket refused: %s", bot_id, exc.reason, logger=log
        )
        return web.json_response({"error": exc.reason}, status=exc.status)
    ws = web.WebSocketResponse(heartbeat=PING_SECONDS, max_msg_size=MAX_FRAME_BYTES)
    await ws.prepare(request)
    metrics.CONNECTION_HANDSHAKES.labels("onebot", "accepted").inc()
    log.info("onebot/%s: reverse WebSocket accepted (%s)", bot_id, "+".join(sorted(channels)))
    await connections.accept(bot, OneBotSocket(ws, transport="ws-reverse", channels=channels, bot=bot))
    return ws


async def _close_accepted(app: web.Application) -> None:
    await app[CONNECTIONS].close_accepted()
