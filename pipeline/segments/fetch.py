"""An SSRF-safe HTTP(S) fetcher for media URLs (S15).

The host name is resolved once per hop, every resolved address is checked, and the connection goes
to the checked IP itself (Host header and TLS SNI/verification keep the original name), so a DNS
answer cannot change between the check and the connect. Redirects are followed by hand, each hop
re-checked, with a bounded count. The body is streamed and abandoned as soon as it passes the limit.
Environment proxies are ignored (a proxy would connect on our behalf to anything).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import httpx

from pipeline.segments.exceptions import MediaUnavailable, UnsafeAddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

# Cloud metadata endpoints that some providers place at otherwise unremarkable addresses.
_METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),  # AWS, GCP, Azure, Volcengine, …
        ipaddress.ip_address("169.254.170.2"),  # AWS ECS task metadata
        ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
        ipaddress.ip_address("fd00:ec2::254"),  # AWS IPv6 IMDS
    }
)
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    # IPv6 forms that carry an IPv4 address the kernel or a gateway will actually reach.
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    return None


def address_refusal(address: IPAddress, *, allow_loopback: bool = False) -> str | None:
    """Why the fetcher must not connect to `address`, or None when it may."""
    embedded = _embedded_ipv4(address)
    if embedded is not None:
        return address_refusal(embedded, allow_loopback=allow_loopback)
    if address in _METADATA_ADDRESSES:
        return "metadata"
    if address.is_loopback:
        return None if allow_loopback else "loopback"
    if address.is_multicast:
        return "multicast"
    if address.is_link_local:
        return "link_local"
    if address.is_unspecified or address.is_reserved:
        return "reserved"
    if address.is_private or not address.is_global:
        return "private"
    return None


async def capped_body(response: httpx.Response, max_bytes: int, *, raw: bool = False) -> bytes:
    """The body of a streamed 200 response, at most `max_bytes` bytes (declared or received),
    else `MediaUnavailable`. `raw`: the bytes as sent, not content-decoded."""
    if response.status_code != 200:
        raise MediaUnavailable(f"http_{response.status_code}")
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise MediaUnavailable("too_large")
    chunks: list[bytes] = []
    received = 0
    async for chunk in response.aiter_raw() if raw else response.aiter_bytes():
        received += len(chunk)
        if received > max_bytes:
            raise MediaUnavailable("too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve with the event loop's getaddrinfo (runs in the default executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True, slots=True)
class FetchedBytes:
    data: bytes
    hops: int  # redirects followed


class SafeFetcher:
    """Fetches http/https URLs without reaching internal addresses. Build once; reuse; `aclose()`."""

    def __init__(
        self,
        *,
        allow_loopback_for_tests: bool = False,
        max_redirects: int = 3,
        timeout_s: float = 10.0,
        resolver: Resolver | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        user_agent: str = "switchboard-media/1",
    ) -> None:
        self._allow_loopback = allow_loopback_for_tests
        self._max_redirects = max_redirects
        self._timeout_s = timeout_s
        self._resolve: Resolver = resolver or system_resolver
        self._client = httpx.AsyncClient(
            transport=transport,
            trust_env=False,  # no environment proxies
            follow_redirects=False,  # redirects are re-checked by hand
            timeout=httpx.Timeout(timeout_s),
            # No connection reuse: the pool is keyed by IP, and a reused TLS connection would carry
            # another host name's SNI.
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"User-Agent": user_agent, "Accept-Encoding": "identity"},
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> SafeFetcher:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _pinned_address(self, url: httpx.URL) -> str:
        host = url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            candidates = [str(ipaddress.ip_address(host))]  # an IP literal needs no lookup
        except ValueError:
            try:
                candidates = await self._resolve(host, port)
            except OSError:
                raise MediaUnavailable("dns_failed") from None
        if not candidates:
            raise MediaUnavailable("dns_failed")
        # Refuse when ANY answer is internal: a name that mixes public and private answers is hostile.
        for candidate in candidates:
            try:
                address = ipaddress.ip_address(candidate.split("%", 1)[0])
            except ValueError:
                raise UnsafeAddress("unparsable_address") from None
            refusal = address_refusal(address, allow_loopback=self._allow_loopback)
            if refusal is not None:
                raise UnsafeAddress(f"address_{refusal}")
        return candidates[0].split("%", 1)[0]

    @staticmethod
    def _checked_url(raw: str | httpx.URL) -> httpx.URL:
        try:
            url = httpx.URL(raw)
        except (httpx.InvalidURL, TypeError, ValueError):
            raise MediaUnavailable("bad_url") from None
        if url.scheme not in ("http", "https"):
            raise MediaUnavailable("scheme_not_allowed")
        if not url.host:
            raise MediaUnavailable("bad_url")
        if url.userinfo:
            raise MediaUnavailable("credentials_in_url")
        return url

    async def fetch(self, raw_url: str, max_bytes: int, headers: Mapping[str, str] | None = None) -> FetchedBytes:
        """GET `raw_url` and return at most `max_bytes` bytes, or raise `MediaUnavailable`.

        `headers` (a platform's `Authorization` for its own media) go to `raw_url`'s origin only: a
        redirect to another scheme, host or port is followed without them."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._fetch(raw_url, max_bytes, headers or {})
        except TimeoutError:
            raise MediaUnavailable("timeout") from None
        except httpx.HTTPError:
            raise MediaUnavailable("transport_error") from None

    async def _fetch(self, raw_url: str, max_bytes: int, headers: Mapping[str, str]) -> FetchedBytes:
        url = self._checked_url(raw_url)
        origin = (url.scheme, url.host, url.port)
        for hop in range(self._max_redirects + 1):
            address = await self._pinned_address(url)
            host_header = url.netloc.decode("ascii")
            extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
            sent = (
                {**headers, "Host": host_header}
                if (url.scheme, url.host, url.port) == origin
                else {"Host": host_header}
            )
            async with self._client.stream(
                "GET", url.copy_with(host=address), headers=sent, extensions=extensions
            ) as response:
                if response.status_code in _REDIRECT_STATUSES:
                    location = response.headers.get("location")
                    if not location:
                        raise MediaUnavailable("redirect_without_location")
                    url = self._checked_url(url.join(location))
                    continue
                return FetchedBytes(await capped_body(response, max_bytes, raw=True), hop)
        raise MediaUnavailable("too_many_redirects")
