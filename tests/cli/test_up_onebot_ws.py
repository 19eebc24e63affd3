"""`switchboard up --onebot-ws`: the banner gives a reverse-WebSocket URL on loopback and an access
token made for the run; a OneBot implementation (the stand-in, dialling as NapCat does) connected
there gets its message answered over the same socket. Without the token it is refused."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from pipeline.bench.onebot_peer import OneBotPeer
from pipeline.embedded import free_port
from tests.platforms.test_onebot import SPEC_PRIVATE

pytestmark = [pytest.mark.integration]


def _up(port: int, tmp_path: Path, out: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    command = [sys.executable, "-m", "pipeline.cli", "up", "--onebot-ws", "--broker", "tansu", "--web-port", str(port)]
    with open(out, "wb") as handle:
        return subprocess.Popen(
            [*command, "--run-dir", str(tmp_path / "run")],
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


async def test_up_with_onebot_ws_answers_a_napcat_on_the_printed_url(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "up.out"
    up = _up(port, tmp_path, out)
    peer: OneBotPeer | None = None
    try:
        deadline = time.monotonic() + 180
        while "switchboard is up" not in out.read_text():
            assert up.poll() is None, out.read_text()
            assert time.monotonic() < deadline, out.read_text()
            await asyncio.sleep(0.5)
        banner = out.read_text()
        url = f"ws://127.0.0.1:{port}/onebot/ws/napcat"
        assert f"onebot ws    {url}" in banner, banner
        match = re.search(r"access token (\S+)", banner)
        assert match is not None, banner
        token = match.group(1)
        assert len(token) >= 24
        # The NapCat line is ready to paste: the run's own token, not a placeholder.
        napcat = re.search(r"websocketClients \+= (\{.*\})", banner)
        assert napcat is not None, banner
        assert json.loads(napcat.group(1)) == {"url": url, "token": token, "messagePostFormat": "array"}

        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url)
            assert refused.value.status == 401

        peer = OneBotPeer(access_token=token)
        peer.dial([url])
        await peer.wait_until(lambda: bool(peer and peer.open_sockets()), 30, "connected")
        text = "hello napcat"
        await peer.send_event(dict(SPEC_PRIVATE, user_id=4242, message_id=77, message=text, raw_message=text))
        await peer.wait_until(lambda: bool(peer and peer.replies()), 60, "answered")
        [reply] = peer.replies()
        assert reply.action == "send_private_msg" and reply.params["user_id"] == 4242
        assert reply.params["message"] == [
            {"type": "reply", "data": {"id": "77"}},  # the answer quotes its message
            {"type": "text", "data": {"text": "echo: hello napcat"}},
        ]
        assert token not in (tmp_path / "run" / "worker0" / "worker.log").read_text(), "the token is never logged"
    finally:
        if peer is not None:
            await peer.stop()
        os.killpg(up.pid, signal.SIGINT)
        try:
            code = up.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            raise
    assert code == 0, out.read_text()


def test_up_with_onebot_ws_only_on_loopback(tmp_path: Path) -> None:
    from tests.cli.support import run

    result = run("up", "--onebot-ws", "--run-dir", str(tmp_path / "run"), env={"SWITCHBOARD_WEB_HOST": "0.0.0.0"})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--onebot-ws serves on loopback only; unset SWITCHBOARD_WEB_HOST (now 0.0.0.0)" in result.stderr
    assert not (tmp_path / "run").exists()
