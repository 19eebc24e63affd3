"""The operator's moderation service, as the hook's contract describes it (docs/controls.md): it
refuses a request without the bearer secret (401) or without the JSON fields (400), and allows a
text unless it says `forbidden`. Keeps every request it decided."""

from __future__ import annotations

from aiohttp import web

HOOK_FIELDS = {"platform", "bot_id", "chat_id", "user_id", "text"}


class ModerationStandIn:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.decided: list[dict[str, str]] = []
        self.refused = 0
        self.runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/moderate"

    @property
    def asked(self) -> list[str]:
        """The texts it was asked about, in order."""
        return [body["text"] for body in self.decided]

    async def handle(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.secret}":
            self.refused += 1
            return web.json_response({"error": "unauthorized"}, status=401)
        body = await request.json()
        if not isinstance(body, dict) or set(body) != HOOK_FIELDS:
            self.refused += 1
            return web.json_response({"error": "bad request"}, status=400)
        self.decided.append(body)
        return web.json_response({"allow": "forbidden" not in body["text"]})

    async def start(self) -> ModerationStandIn:
        app = web.Application()
        app.router.add_post("/moderate", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = int(self.runner.addresses[0][1])
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def __aenter__(self) -> ModerationStandIn:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
