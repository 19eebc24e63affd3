"""Ark control plane (signed OpenAPI), the correction endpoint, admin endpoints and the CLI."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from pipeline.session import ArkOpenAPIProvisioner, AuthError, SessionClient
from pipeline.sim import SimServer

from .conftest import API_KEY
from .helpers import final_reply, segments_text, turn


async def test_ark_openapi_provisioner_round_trip(sim: SimServer, ark: SessionClient) -> None:
    provisioner = ArkOpenAPIProvisioner(
        access_key="switchboard-sim-ak", secret_key="switchboard-sim-sk", agent_id="agent-1", endpoint=sim.root_url
    )
    try:
        sid = await provisioner.create_session()
        assert sid in sim.sessions
        assert segments_text(final_reply(await turn(ark, sid, "hi"))) == "echo: hi"
        await provisioner.delete_session(sid)
        assert sid not in sim.sessions
        await provisioner.delete_session(sid)  # already gone: not an error
    finally:
        await provisioner.aclose()


async def test_ark_openapi_rejects_bad_signature(sim: SimServer) -> None:
    provisioner = ArkOpenAPIProvisioner(
        access_key="switchboard-sim-ak", secret_key="wrong", agent_id="a", endpoint=sim.root_url
    )
    try:
        with pytest.raises(AuthError):
            await provisioner.create_session()
    finally:
        await provisioner.aclose()


async def _complete(
    sim: SimServer, content: str, *, key: str = API_KEY, path: str = "/chat/completions", read_timeout: float = 5
) -> httpx.Response:
    async with httpx.AsyncClient(base_url=sim.root_url, timeout=read_timeout) as http:
        return await http.post(
            path,
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "corrector",
                "messages": [{"role": "system", "content": "fix it"}, {"role": "user", "content": content}],
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "reply", "schema": {"type": "object"}},
                },
            },
        )


def _answer(response: httpx.Response) -> str:
    assert response.status_code == 200
    return str(response.json()["choices"][0]["message"]["content"])


async def test_correction_endpoint(sim: SimServer) -> None:
    valid = '{"segments":[{"type":"text","data":{"text":"hi"}}]}'
    assert json.loads(_answer(await _complete(sim, f"```json\n{valid}\n```"))) == json.loads(valid)
    assert json.loads(
        _answer(await _complete(sim, f"Sure! Here it is: {valid} hope that helps", path="/api/v3/chat/completions"))
    ) == json.loads(valid)
    wrapped = json.loads(_answer(await _complete(sim, "<reply>just prose</reply>")))
    assert wrapped == {"segments": [{"type": "text", "data": {"text": "just prose"}}]}
    still_bad = _answer(await _complete(sim, "SIM-UNCORRECTABLE nope"))
    with pytest.raises(ValueError):
        json.loads(still_bad)
    assert (await _complete(sim, "x", key="wrong")).status_code == 401


async def test_slow_correction_hits_the_callers_deadline(sim: SimServer) -> None:
    with pytest.raises(httpx.ReadTimeout):
        await _complete(sim, "SIM-SLOW-CORRECTION please", read_timeout=0.3)


async def test_admin_faults_and_stats(sim: SimServer) -> None:
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        assert (await http.post("/_sim/faults", json={"nope": 1})).status_code == 400
        faults = (await http.post("/_sim/faults", json={"latency_ms": 5, "seed": 1})).json()
        assert faults["latency_ms"] == 5
        assert (await http.get("/_sim/faults")).json()["latency_ms"] == 5
        sid = (await http.post("/_sim/sessions")).json()["id"]
        assert sid.startswith("sesn-")
        stats = (await http.get("/_sim/stats")).json()
        assert stats["sessions"] == 1 and stats["open_streams"] == 0


def test_cli_starts_and_prints_its_port() -> None:
    # How long it takes to start is a figure for bench/session_bench.py (printed there), not a pass
    # mark here; the bound below only turns a hang into a failure.
    process = subprocess.Popen(
        [sys.executable, "-m", "pipeline.sim.cli", "--port", "0", "--api-key", "k"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        stdout = process.stdout
        with ThreadPoolExecutor(1) as reader:
            # On a hang, terminating the process (finally) closes its stdout and ends the read.
            lines = reader.submit(lambda: [stdout.readline(), stdout.readline()]).result(timeout=60)
        assert lines[1].startswith("port="), lines
        port = int(lines[1].strip().removeprefix("port="))
        response = httpx.get(f"http://127.0.0.1:{port}/_sim/stats")
        assert response.status_code == 200 and response.json()["sessions"] == 0
    finally:
        process.terminate()
        process.wait(5)


async def test_sim_server_starts_on_a_free_port_and_answers() -> None:
    server = SimServer()
    async with asyncio.timeout(30):  # a hang bound only; the start-up time is in bench/session_bench.py
        port = await server.start()
    try:
        assert port > 0
        async with httpx.AsyncClient() as http:
            stats = await http.get(f"http://127.0.0.1:{port}/_sim/stats")
        assert stats.status_code == 200 and stats.json()["open_streams"] == 0
    finally:
        await server.stop()
    await asyncio.sleep(0)
