"""Provisioners and Volcengine V4 signing."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx

from pipeline.session import AnthropicProvisioner, Provisioner, SessionClient, StaticPoolProvisioner, volc_sign
from pipeline.session.provisioning import ArkOpenAPIProvisioner


def test_sign_then_verify_and_tamper_detection() -> None:
    # A round trip through volc_sign's own sign and verify: it shows tampering is caught, not that the
    # signature is Volcengine's. That is checked against the official SDK in test_volc_sign_sdk.py.
    body = b'{"AgentId":"a"}'
    query = {"Action": "CreateSession", "Version": "2024-01-01"}
    headers = volc_sign.sign(
        access_key="AK",
        secret_key="SK",
        method="POST",
        host="open.test",
        path="/",
        query=query,
        body=body,
        region="cn-beijing",
        service="ark",
        now=datetime(2026, 4, 1, 12, 0, tzinfo=UTC),
    )
    assert headers["X-Date"] == "20260401T120000Z"
    assert headers["Authorization"].startswith("HMAC-SHA256 Credential=AK/20260401/cn-beijing/ark/request, ")
    verify = dict(credentials={"AK": "SK"}, method="POST", path="/", query=query, headers=headers)
    assert volc_sign.verify(body=body, **verify) == "AK"  # type: ignore[arg-type]
    assert volc_sign.verify(body=b'{"AgentId":"b"}', **verify) is None  # type: ignore[arg-type]
    assert volc_sign.verify(body=body, **{**verify, "query": {**query, "Action": "DeleteSession"}}) is None  # type: ignore[arg-type]
    assert volc_sign.verify(body=body, **{**verify, "credentials": {"AK": "other"}}) is None  # type: ignore[arg-type]


async def test_static_pool_leases_and_releases() -> None:
    pool = StaticPoolProvisioner(["s1", "s2"])
    assert isinstance(pool, Provisioner)
    assert [await pool.create_session(), await pool.create_session()] == ["s1", "s2"]
    assert await pool.create_session() in ("s1", "s2")  # exhausted: shared rather than failing
    await pool.delete_session("s1")
    assert await pool.create_session() == "s1"


async def test_anthropic_provisioner_uses_the_data_plane() -> None:
    requests: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        if request.method == "POST":
            return httpx.Response(200, json={"id": "sesn-9", "type": "session"})
        return httpx.Response(404)

    client = SessionClient(
        api_key="k", profile="anthropic", base_url="http://a.test/v1", transport=httpx.MockTransport(handler)
    )
    provisioner = AnthropicProvisioner(client, agent="agent-1", environment_id="env-1")
    assert await provisioner.create_session(title="t") == "sesn-9"
    await provisioner.delete_session("sesn-9")  # 404 = already gone
    assert json.loads(requests[0].content) == {"agent": "agent-1", "environment_id": "env-1", "title": "t"}
    assert [r.method for r in requests] == ["POST", "DELETE"]
    await client.aclose()


async def test_ark_openapi_provisioner_request_shape() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ResponseMetadata": {"RequestId": "r"}, "Result": {"Id": "sesn-ark"}})

    provisioner = ArkOpenAPIProvisioner(
        access_key="AK",
        secret_key="SK",
        agent_id="agent-7",
        endpoint="https://open.test",
        transport=httpx.MockTransport(handler),
    )
    assert await provisioner.create_session() == "sesn-ark"
    request = seen[0]
    assert request.url.params["Action"] == "CreateSession" and request.url.params["Version"] == "2024-01-01"
    assert json.loads(request.content) == {"AgentId": "agent-7"}
    # Accepted by the simulator's verifier; that the header is what Volcengine computes is checked
    # against the official SDK in test_volc_sign_sdk.py.
    assert (
        volc_sign.verify(
            credentials={"AK": "SK"},
            method="POST",
            path="/",
            query=dict(request.url.params),
            headers=dict(request.headers),
            body=request.content,
        )
        == "AK"
    )
    await provisioner.aclose()
