"""Volcengine OpenAPI V4 request signing (HMAC-SHA256), used for Ark's control plane.

Same structure as AWS SigV4 with Volcengine's names: ``X-Date``, ``X-Content-Sha256``, credential scope
``<yyyymmdd>/<region>/<service>/request`` and a signing key derived from the secret key directly.
The simulator verifies with :func:`verify` so the provisioner can be tested end to end.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote

ALGORITHM = "HMAC-SHA256"
_SIGNED_HEADER_NAMES = ("content-type", "host", "x-content-sha256", "x-date")


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def _canonical_query(query: Mapping[str, str]) -> str:
    return "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items()))


def signing_key(secret_key: str, date: str, region: str, service: str) -> bytes:
    k_date = _hmac(secret_key.encode(), date)
    k_region = _hmac(k_date, region)
    k_service = _hmac(k_region, service)
    return _hmac(k_service, "request")


def _signature(
    *,
    secret_key: str,
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    signed_names: list[str],
    body_hash: str,
    x_date: str,
    region: str,
    service: str,
) -> str:
    lowered = {k.lower(): v.strip() for k, v in headers.items()}
    canonical_headers = "".join(f"{name}:{lowered.get(name, '')}\n" for name in signed_names)
    canonical_request = "\n".join(
        [
            method.upper(),
            path or "/",
            _canonical_query(query),
            canonical_headers,
            ";".join(signed_names),
            body_hash,
        ]
    )
    scope = f"{x_date[:8]}/{region}/{service}/request"
    string_to_sign = "\n".join([ALGORITHM, x_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()])
    key = signing_key(secret_key, x_date[:8], region, service)
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


def sign(
    *,
    access_key: str,
    secret_key: str,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    body: bytes,
    region: str,
    service: str,
    content_type: str = "application/json",
    now: datetime | None = None,
) -> dict[str, str]:
    """Return the headers to add to the request (Host is included because it is signed)."""
    x_date = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    body_hash = hashlib.sha256(body).hexdigest()
    headers = {"Content-Type": content_type, "Host": host, "X-Content-Sha256": body_hash, "X-Date": x_date}
    names = list(_SIGNED_HEADER_NAMES)
    signature = _signature(
        secret_key=secret_key,
        method=method,
        path=path,
        query=query,
        headers=headers,
        signed_names=names,
        body_hash=body_hash,
        x_date=x_date,
        region=region,
        service=service,
    )
    scope = f"{x_date[:8]}/{region}/{service}/request"
    headers["Authorization"] = (
        f"{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def verify(
    *,
    credentials: Mapping[str, str],
    method: str,
    path: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: bytes,
) -> str | None:
    """Check a signed request against ``{access_key: secret_key}``. Returns the access key or None."""
    authorization = headers.get("Authorization") or headers.get("authorization") or ""
    if not authorization.startswith(ALGORITHM + " "):
        return None
    try:
        parts = dict(p.strip().split("=", 1) for p in authorization[len(ALGORITHM) + 1 :].split(","))
        access_key, date, region, service, terminator = parts["Credential"].split("/")
        signed_names = parts["SignedHeaders"].split(";")
        claimed = parts["Signature"]
    except (KeyError, ValueError):
        return None
    secret_key = credentials.get(access_key)
    x_date = headers.get("X-Date") or headers.get("x-date") or ""
    if secret_key is None or terminator != "request" or x_date[:8] != date:
        return None
    body_hash = hashlib.sha256(body).hexdigest()
    lowered = {k.lower(): v for k, v in headers.items()}
    if lowered.get("x-content-sha256", body_hash) != body_hash:
        return None
    expected = _signature(
        secret_key=secret_key,
        method=method,
        path=path,
        query=query,
        headers=lowered,
        signed_names=signed_names,
        body_hash=body_hash,
        x_date=x_date,
        region=region,
        service=service,
    )
    return access_key if hmac.compare_digest(expected, claimed) else None
