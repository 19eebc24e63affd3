"""Session creation and deletion: a pluggable :class:`Provisioner`.

* ``AnthropicProvisioner``: data plane ``POST /v1/sessions`` / ``DELETE /v1/sessions/{id}``.
* ``StaticPoolProvisioner``: Ark sessions created out of band, ids from config; leased round robin.
* ``ArkOpenAPIProvisioner``: Volcengine OpenAPI ``CreateSession`` / ``DeleteSession`` signed with AK/SK.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit

import httpx

from pipeline.session import volc_sign
from pipeline.session.client import SessionClient, error_for_status
from pipeline.session.exceptions import NotFoundError, ProtocolError, TransportError


@runtime_checkable
class Provisioner(Protocol):
    async def create_session(self, **params: Any) -> str:
        """Create (or lease) a session and return its id."""
        ...

    async def delete_session(self, session_id: str) -> None:
        """Delete (or release) a session. Deleting a session that is already gone is not an error."""
        ...


class AnthropicProvisioner:
    def __init__(
        self, client: SessionClient, *, agent: str | Mapping[str, Any], environment_id: str, **defaults: Any
    ) -> None:
        self._client = client
        self._body: dict[str, Any] = {"agent": agent, "environment_id": environment_id, **defaults}

    async def create_session(self, **params: Any) -> str:
        created = await self._client.create_session({**self._body, **params})
        return str(created["id"])

    async def delete_session(self, session_id: str) -> None:
        await self._client.delete_session(session_id)


class StaticPoolProvisioner:
    """Hands out pre-created session ids; a leased id goes back to the pool on delete."""

    def __init__(self, session_ids: Sequence[str]) -> None:
        if not session_ids:
            raise ValueError("StaticPoolProvisioner needs at least one session id")
        self._free: list[str] = list(session_ids)
        self._known = frozenset(session_ids)
        self._cycle = 0

    async def create_session(self, **params: Any) -> str:
        if self._free:
            return self._free.pop(0)
        # Pool exhausted: share sessions round robin rather than fail (sessions queue messages).
        ids = sorted(self._known)
        self._cycle = (self._cycle + 1) % len(ids)
        return ids[self._cycle]

    async def delete_session(self, session_id: str) -> None:
        if session_id in self._known and session_id not in self._free:
            self._free.append(session_id)


class ArkOpenAPIProvisioner:
    """Calls ``POST {endpoint}/?Action=CreateSession&Version=…`` with a Volcengine V4 signature.

    Body of CreateSession: ``{"AgentId": agent_id, **params}``; the id is read from ``Result.Id`` (or
    ``Result.SessionId``). DeleteSession sends ``{"Id": session_id}``. Field names are configurable
    through ``params`` because the public reference of those actions is not part of our spec.
    """

    def __init__(
        self,
        *,
        access_key: str,
        secret_key: str,
        agent_id: str,
        endpoint: str = "https://open.volcengineapi.com",
        region: str = "cn-beijing",
        service: str = "ark",
        version: str = "2024-01-01",
        timeout: float = 15.0,
        max_attempts: int = 3,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._access_key = access_key
        self._secret_key = secret_key
        self._agent_id = agent_id
        self._endpoint = endpoint.rstrip("/")
        self._host = urlsplit(self._endpoint).netloc
        self._region = region
        self._service = service
        self._version = version
        self._max_attempts = max_attempts
        self._http = httpx.AsyncClient(timeout=timeout, transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_session(self, **params: Any) -> str:
        result = await self._call("CreateSession", {"AgentId": self._agent_id, **params})
        session_id = result.get("Id") or result.get("SessionId")
        if not isinstance(session_id, str):
            raise ProtocolError("CreateSession answer has no Result.Id", body=result)
        return session_id

    async def delete_session(self, session_id: str) -> None:
        try:
            await self._call("DeleteSession", {"Id": session_id})
        except NotFoundError:
            pass

    async def _call(self, action: str, payload: Mapping[str, Any]) -> dict[str, Any]:
        query = {"Action": action, "Version": self._version}
        body = json.dumps(payload, separators=(",", ":")).encode()
        for attempt in range(self._max_attempts):
            # Re-sign on every attempt: the signature covers X-Date.
            headers = volc_sign.sign(
                access_key=self._access_key,
                secret_key=self._secret_key,
                method="POST",
                host=self._host,
                path="/",
                query=query,
                body=body,
                region=self._region,
                service=self._service,
            )
            try:
                response = await self._http.post(f"{self._endpoint}/", params=query, content=body, headers=headers)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt + 1 >= self._max_attempts:
                    raise TransportError(f"{action}: {exc!r}") from exc
                await asyncio.sleep(0.2 * 2**attempt)
                continue
            decoded: Any = response.json() if response.content else {}
            metadata = decoded.get("ResponseMetadata") if isinstance(decoded, dict) else None
            metadata_error = metadata.get("Error") if isinstance(metadata, dict) else None
            if response.status_code >= 400 or metadata_error:
                if response.status_code >= 500 and attempt + 1 < self._max_attempts:
                    await asyncio.sleep(0.2 * 2**attempt)
                    continue
                raise error_for_status(response.status_code if response.status_code >= 400 else 400, decoded)
            result = decoded.get("Result") if isinstance(decoded, dict) else None
            return result if isinstance(result, dict) else {}
        raise TransportError(f"{action}: no attempt succeeded")
