"""Volcengine V4 signing checked against the official ``volcengine`` SDK's signer, not against itself.

``volc_sign.verify`` (used by the simulator) shares ``_signature`` with ``volc_sign.sign``, so a bug in
the canonical request, the scope or the key derivation would be signed and verified alike and pass.
Here the expected ``Authorization`` comes from ``volcengine.auth.SignerV4`` (the signer Volcengine's
own Python SDK sends its OpenAPI calls with), fed the same method, host, path, query, body, date and
credentials; and requests the SDK signed must be accepted by the simulator's verifier.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

# The official SDK (dev extra). Imported outright, not importorskip: without it this check must fail,
# not silently vanish.
from volcengine.auth.SignerV4 import SignerV4
from volcengine.auth.SignParam import SignParam
from volcengine.Credentials import Credentials

from pipeline.session import volc_sign
from pipeline.session.provisioning import ArkOpenAPIProvisioner


def sdk_sign(
    *,
    access_key: str,
    secret_key: str,
    method: str,
    host: str,
    path: str,
    query: dict[str, str],
    body: bytes,
    region: str,
    service: str,
    content_type: str,
    when: datetime,
) -> Any:
    """The SDK's header signature (``SignerV4.sign_only``) of one request; returns its ``SignResult``.

    The SDK signs Content-Type, Host and every ``X-`` header it is given plus the X-Date and
    X-Content-Sha256 it adds itself: the same four headers ``volc_sign`` signs.
    """
    param = SignParam()
    param.set_method(method)
    param.set_host(host)
    param.set_path(path)
    param.set_query(OrderedDict(query))
    param.set_body(body)
    param.set_date(when)
    param.set_header_list(OrderedDict([("Content-Type", content_type), ("Host", host)]))
    return SignerV4.sign_only(param, Credentials(access_key, secret_key, service, region))


CASES = [
    # The provisioner's own call shape.
    dict(
        method="POST",
        host="open.volcengineapi.com",
        path="/",
        query={"Action": "CreateSession", "Version": "2024-01-01"},
        body=b'{"AgentId":"agent-7"}',
        region="cn-beijing",
        service="ark",
        content_type="application/json",
    ),
    # Query keys out of order, values needing percent-encoding (space, slash, non-ASCII, reserved
    # characters), an empty body and another region/service: each is a place a canonicalisation bug hides.
    dict(
        method="GET",
        host="open.volcengineapi.com",
        path="/",
        query={"Version": "2024-01-01", "Action": "ListThings", "Name": "a b/c~d*e+f", "Tag": "会话=1&x"},
        body=b"",
        region="ap-southeast-1",
        service="iam",
        content_type="application/x-www-form-urlencoded; charset=utf-8",
    ),
    dict(
        method="POST",
        host="ark.cn-shanghai.volcengineapi.com",
        path="/",
        query={},
        body='{"Id":"sesn-1","Note":"é"}'.encode(),
        region="cn-shanghai",
        service="ark",
        content_type="application/json",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=["create-session", "encoded-query", "empty-query"])
def test_sign_matches_the_official_sdk(case: dict[str, Any]) -> None:
    when = datetime(2026, 4, 1, 12, 34, 56, tzinfo=UTC)
    ours = volc_sign.sign(
        access_key="AKLTexample",
        secret_key="c2VjcmV0LWtleQ==",
        method=case["method"],
        host=case["host"],
        path=case["path"],
        query=case["query"],
        body=case["body"],
        region=case["region"],
        service=case["service"],
        content_type=case["content_type"],
        now=when,
    )
    theirs = sdk_sign(access_key="AKLTexample", secret_key="c2VjcmV0LWtleQ==", when=when, **case)
    assert ours["X-Date"] == theirs.xdate == "20260401T123456Z"
    assert ours["X-Content-Sha256"] == theirs.xContextSha256
    # The whole header: algorithm, credential scope, signed header list and signature.
    assert ours["Authorization"] == theirs.authorization


@pytest.mark.parametrize("case", CASES, ids=["create-session", "encoded-query", "empty-query"])
def test_the_simulator_accepts_what_the_sdk_signs(case: dict[str, Any]) -> None:
    when = datetime(2026, 4, 1, 12, 34, 56, tzinfo=UTC)
    signed = sdk_sign(access_key="AKLTexample", secret_key="c2VjcmV0LWtleQ==", when=when, **case)
    headers = {
        "Content-Type": case["content_type"],
        "Host": case["host"],
        "X-Date": signed.xdate,
        "X-Content-Sha256": signed.xContextSha256,
        "Authorization": signed.authorization,
    }
    request = dict(method=case["method"], path=case["path"], query=case["query"], headers=headers)
    assert volc_sign.verify(credentials={"AKLTexample": "c2VjcmV0LWtleQ=="}, body=case["body"], **request) == (
        "AKLTexample"
    )
    # And it still refuses a wrong secret and a body other than the one signed.
    assert volc_sign.verify(credentials={"AKLTexample": "other"}, body=case["body"], **request) is None
    assert volc_sign.verify(credentials={"AKLTexample": "c2VjcmV0LWtleQ=="}, body=b"{}x", **request) is None


async def test_the_provisioners_request_as_sent_carries_the_sdks_signature() -> None:
    """End to end: re-sign the request the provisioner put on the wire with the SDK; same header."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ResponseMetadata": {"RequestId": "r"}, "Result": {"Id": "sesn-ark"}})

    provisioner = ArkOpenAPIProvisioner(
        access_key="AKLTexample",
        secret_key="c2VjcmV0LWtleQ==",
        agent_id="agent-7",
        endpoint="https://open.volcengineapi.com",
        region="cn-beijing",
        service="ark",
        transport=httpx.MockTransport(handler),
    )
    try:
        assert await provisioner.create_session(Title="a b") == "sesn-ark"
    finally:
        await provisioner.aclose()
    request = seen[0]
    assert json.loads(request.content) == {"AgentId": "agent-7", "Title": "a b"}
    signed_at = datetime.strptime(request.headers["X-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    theirs = sdk_sign(
        access_key="AKLTexample",
        secret_key="c2VjcmV0LWtleQ==",
        method=request.method,
        host=request.headers["Host"],
        path=request.url.path,
        query=dict(request.url.params),
        body=request.content,
        region="cn-beijing",
        service="ark",
        content_type=request.headers["Content-Type"],
        when=signed_at,
    )
    assert request.headers["X-Content-Sha256"] == theirs.xContextSha256
    assert request.headers["Authorization"] == theirs.authorization
