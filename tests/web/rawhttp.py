"""Raw-socket helpers for the web tests: connect to a worker, read what it answers, see it close."""

from __future__ import annotations

import asyncio
import importlib

from prometheus_client import REGISTRY

from pipeline.platforms import known_platforms
from pipeline.settings import BotConfig

from .conftest import Worker, console_bot

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def connect(worker: Worker) -> Conn:
    return await asyncio.open_connection("127.0.0.1", worker.port)


def closed_total(reason: str) -> float:
    return REGISTRY.get_sample_value("switchboard_web_connections_closed_total", {"reason": reason}) or 0.0


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server closes the connection (EOF or reset) within `within` seconds (a bound that
    only catches a hang: the deadlines under test are much shorter)."""
    try:
        async with asyncio.timeout(within):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


async def read_until_closed(reader: asyncio.StreamReader, within: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection; and whether it reset it (then
    the end of what it sent may be lost)."""
    data = bytearray()
    async with asyncio.timeout(within):
        try:
            while chunk := await reader.read(65536):
                data += chunk
        except ConnectionError:
            return bytes(data), True
    return bytes(data), False


def statuses(stream: bytes) -> list[int]:
    """The status of each whole HTTP/1.1 response in `stream` (bodies framed by Content-Length)."""
    found = []
    while stream:
        end = stream.find(b"\r\n\r\n")
        if end < 0:
            break
        head = stream[:end].decode("latin-1").split("\r\n")
        status = int(head[0].split(" ")[1])
        if status >= 200:  # not an interim answer (100 Continue)
            found.append(status)
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value)
        stream = stream[end + 4 + length :]
    return found


def webhook_bots() -> list[BotConfig]:
    """A webhook bot of every platform (each platform's test fixtures' own), the console's included."""
    bots = []
    for name in known_platforms():
        if name == "console":
            bots.append(console_bot())
        else:
            fixtures = importlib.import_module(f"tests.platforms.test_{name}")
            bots.append(fixtures.bot_config())
    return bots
