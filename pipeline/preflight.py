"""Checks a command makes before it starts anything slow: each returns one plain line or None.

A worker that cannot bind its port, reach Kafka or reach Redis otherwise fails seconds later with
a library's traceback; these say what is wrong and which setting to change. A refused connection
is tried again until the timeout, so a server restarting at that moment (a Redis restart while a
replacement worker starts) does not stop the worker.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline.redact import redact_url

if TYPE_CHECKING:
    from pipeline.settings import Settings

DEFAULT_TIMEOUT = 3.0
_RETRY_PAUSE = 0.25


def port_problem(host: str, port: int, how_to_change: str) -> str | None:
    """None when `host:port` can be bound now (as the web server binds it, with SO_REUSEADDR)."""
    if port == 0:
        return None  # any free port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                holder = switchboard_holder(port) if _is_switchboard(host, port) else "another program holds it"
                # "address already in use": the phrase process supervisors look for (pipeline.embedded).
                return f"port {port} on {host}: address already in use ({holder}); {how_to_change}"
            return f"cannot listen on {host}:{port}: {exc.strerror or exc}; {how_to_change}"
    return None


def _is_switchboard(host: str, port: int) -> bool:
    """Whether the program on the port answers `/healthz` like a Switchboard worker."""
    address = "127.0.0.1" if host in ("0.0.0.0", "") else host  # a wildcard bind answers on loopback
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/healthz", timeout=1.0) as response:
            body = json.loads(response.read(4096))
    except Exception:  # not HTTP, not JSON, no answer: someone else
        return False
    return isinstance(body, dict) and body.get("status") == "ok" and "instance" in body


# What `switchboard up` writes into its run directory while it runs (pipeline.cli): its own pid and
# each part's, so a later `up` refused the port can say which run holds it and how to stop it.
UP_PID_FILE = "switchboard-up.json"


def switchboard_holder(port: int) -> str:
    """Which Switchboard listens on `port` and how to stop it, as far as this machine tells: the
    worker's pid from /proc (Linux), its run directory (a worker of `switchboard up` runs in
    `<run dir>/worker0`) and, from that run's pid file, the `up` that owns it."""
    pids = _listening_pids(port)
    if not pids:
        return "another Switchboard holds it"
    worker = pids[0]
    for run_dir in _candidate_run_dirs(worker):
        try:
            record = json.loads((run_dir / UP_PID_FILE).read_text())
            up_pid = int(record["pid"])
            parts = [int(p) for p in record.get("parts", {}).values()]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _alive(up_pid):
            return (
                f"the Switchboard of `switchboard up` pid {up_pid}, run directory {run_dir}, holds it; "
                f"stop it with Ctrl-C in its terminal or `kill {up_pid}`"
            )
        left = [str(p) for p in dict.fromkeys([*parts, worker]) if _alive(p)]
        return (
            f"a worker left by a `switchboard up` that is gone (pid {up_pid}), run directory {run_dir}, "
            f"holds it; stop what that run left with `kill {' '.join(left)}`"
        )
    return f"another Switchboard, pid {worker}, holds it; stop it with `kill {worker}`"


def _candidate_run_dirs(pid: int) -> list[Path]:
    try:
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return []
    return [cwd.parent, cwd]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _listening_pids(port: int) -> list[int]:
    """Pids of the processes holding a listening TCP socket on `port` (Linux /proc; [] elsewhere or
    when the processes belong to another user)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; the inode is the tenth field.
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    if not inodes:
        return []
    wanted = {f"socket:[{inode}]" for inode in inodes}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    found.append(int(entry.name))
                    break
            except OSError:
                continue
    return sorted(found)


def kafka_problem(bootstrap: str, variable: str, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """None when at least one bootstrap server accepts a TCP connection within `timeout`."""
    servers = [s.strip() for s in bootstrap.split(",") if s.strip()]
    if not servers:
        return f"{variable} is empty"
    reasons = []
    for server in servers:
        # `scheme://user:password@host:port`: only the address is dialled (and named in the refusal).
        host, port = _host_port(server.split("://", 1)[-1].rpartition("@")[2], default_port=9092)
        reason = _connect_problem(host, port, timeout)
        if reason is None:
            return None
        reasons.append(reason)
    return f"cannot reach Kafka at {redact_url(bootstrap)} ({variable}): {'; '.join(sorted(set(reasons)))}"


def redis_problem(url: str, variable: str, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """None when Redis at `url` answers PING within `timeout` (with the URL's credentials; a
    cluster: any of the URL's nodes)."""
    import redis
    from redis.exceptions import AuthenticationError, ResponseError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    from pipeline.state.redis_url import ClusterTarget, Endpoint, parse_redis_url

    where = redis_address(url)
    deadline = time.monotonic() + timeout
    socket_options = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    try:
        target = None if url.lower().startswith("unix:") else parse_redis_url(url)
        if target is None or isinstance(target, Endpoint):
            clients = [redis.Redis.from_url(url, **socket_options)]
    except ValueError as exc:  # not a Redis URL
        return f"{variable} is not a Redis URL ({redact_url(str(exc))})"
    if isinstance(target, ClusterTarget):
        clients = [
            redis.Redis(
                host=host,
                port=port,
                username=target.username,
                password=target.password,
                ssl=target.tls,
                **socket_options,  # type: ignore[arg-type]
            )
            for host, port in target.nodes
        ]
    elif target is not None and not isinstance(
        target, Endpoint
    ):  # the primary the sentinels name (redis-py's MasterNotFoundError is a ConnectionError)
        from redis.sentinel import Sentinel

        tls = {"ssl": True} if target.tls else {}
        sentinel_auth = {"password": target.sentinel_password} if target.sentinel_password else {}
        sentinel = Sentinel(list(target.sentinels), sentinel_kwargs={**socket_options, **tls, **sentinel_auth})
        clients = [
            sentinel.master_for(
                target.master,
                db=target.db,
                username=target.username,
                password=target.password,
                **socket_options,
                **tls,
            )
        ]
    try:
        while True:
            for client in clients:
                try:
                    client.ping()
                    return None
                except (AuthenticationError, ResponseError) as exc:
                    return f"Redis at {where} ({variable}) refused the connection: {redact_url(str(exc))}"
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    problem = exc
            if time.monotonic() >= deadline:
                return f"cannot reach Redis at {where} ({variable}): {redact_url(_short(problem))}"
            time.sleep(_RETRY_PAUSE)
    finally:
        for client in clients:
            client.close()


def redis_address(url: str) -> str:
    """`host:port/db` of a Redis URL (`master via sentinel:port,…/db` for a sentinel URL, `cluster
    via host:port,…` for a cluster URL), without its user name or password."""
    from pipeline.state.redis_url import ClusterTarget, Endpoint, parse_redis_url

    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    try:
        target = parse_redis_url(url)
    except ValueError:
        return f"{parts.scheme}://…"
    if isinstance(target, ClusterTarget):
        return target.address
    return f"{target.address}/{target.db}" if isinstance(target, Endpoint) or target.db else target.address


def _host_port(server: str, default_port: int) -> tuple[str, int]:
    if server.startswith("["):  # [::1]:9092
        host, _, rest = server[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    host, sep, port = server.rpartition(":")
    if not sep or not port.isdigit():
        return server, default_port
    return host, int(port)


def _connect_problem(host: str, port: int, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
                return None
        except socket.gaierror:
            return f"cannot resolve {host}"
        except TimeoutError:
            return f"no answer from {host}:{port} within {timeout:g} s"
        except OSError as exc:
            if time.monotonic() >= deadline:
                return f"{host}:{port}: {_short(exc)}"
        time.sleep(_RETRY_PAUSE)


def _short(exc: BaseException) -> str:
    from redis.sentinel import MasterNotFoundError

    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    if isinstance(exc, MasterNotFoundError):  # its text lists every sentinel client's repr
        return "no sentinel answered with the primary's address"
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0]


# -- the session API ------------------------------------------------------------------------------------


def session_problems(settings: Settings) -> list[str]:
    """What the session settings lack as a whole, beyond the variables `load_settings` requires:
    a provisioner that cannot create sessions of the profile, and the agent (and environment) new
    sessions are created with. Their defaults are placeholders no real API knows, so a worker
    would otherwise fail only at its first turn."""
    from pipeline.settings import env_name

    profile, provisioner = settings.session_profile, settings.session_provisioner
    problems = []
    set_explicitly = settings.model_fields_set
    profile_var, provisioner_var = env_name("session_profile"), env_name("session_provisioner")
    if profile == "ark" and provisioner == "anthropic":
        problems.append(
            f"{profile_var}=ark with {provisioner_var}=anthropic: Ark does not create sessions on its data "
            f"plane (docs/session-protocol.md); use {provisioner_var}=ark-openapi (Volcengine OpenAPI, with "
            f"{env_name('ark_access_key')} and {env_name('ark_secret_key')}) or static "
            f"({env_name('session_static_ids')}), or unset it"
        )
    elif profile == "anthropic" and provisioner == "ark-openapi":
        problems.append(
            f"{profile_var}=anthropic with {provisioner_var}=ark-openapi: that provisioner creates Ark "
            f"sessions; use {provisioner_var}=anthropic or static, or unset it"
        )
    if provisioner in ("ark-openapi", "anthropic") and not (
        "session_agent_id" in set_explicitly and settings.session_agent_id
    ):
        problems.append(
            f"{env_name('session_agent_id')} is not set (the agent each new session runs; "
            f"the {provisioner} provisioner creates sessions with it)"
        )
    if provisioner == "anthropic" and not (
        "session_environment_id" in set_explicitly and settings.session_environment_id
    ):
        problems.append(f"{env_name('session_environment_id')} is not set (the environment each new session runs in)")
    return problems


# A session id no server has: asking for it costs one request and no session, and the answer says
# whether the key is accepted (404) or not (401/403).
_PROBE_SESSION = "sesn_switchboard_preflight"


def session_api_problem(settings: Settings, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """One real, cheap call to the session API with the configured key: None when it is accepted
    (or the API cannot be reached now: a worker must not depend on its start order), else what the
    API answered and which setting to check."""
    import httpx

    from pipeline.session.profiles import PROFILES
    from pipeline.settings import env_name

    profile = PROFILES[settings.session_profile]
    base = (settings.session_base_url or profile.default_base_url).rstrip("/")
    key = settings.session_api_key.get_secret_value() if settings.session_api_key else ""
    where = f"the session API at {redact_url(base)} ({env_name('session_base_url')})"
    try:
        response = httpx.get(
            f"{base}/sessions/{_PROBE_SESSION}/events",
            params={"limit": 1},
            headers={"Accept": "application/json", **profile.auth_headers(key)},
            timeout=timeout,
        )
    except httpx.HTTPError:
        return None
    status = response.status_code
    if status in (401, 403):
        return f"{where} refused {env_name('session_api_key')} ({status})"
    if status == 404 and _looks_like_a_session_api(response):
        return None
    if status < 500 and status not in (404, 429):
        return f"{where} answered {status} to a session lookup: check the URL and {env_name('session_profile')}"
    if status == 404:
        return (
            f"{where} has no sessions endpoint (404 without a JSON error): check the URL (it ends in "
            f"{profile.base_path} for {env_name('session_profile')}={profile.name}) and the profile"
        )
    return None  # busy or failing now: not a settings problem


def _looks_like_a_session_api(response: Any) -> bool:
    """A 404 for an unknown session is a JSON error body; a wrong path is usually a plain page."""
    return "json" in response.headers.get("content-type", "")


def ark_openapi_problem(settings: Settings, timeout: float = DEFAULT_TIMEOUT) -> str | None:
    """For the ark-openapi provisioner, one signed call to Volcengine OpenAPI that changes nothing
    (DeleteSession of a session nobody has: "not found" means the signature was accepted): None
    when the keys are accepted or the endpoint cannot be reached or says something else, else
    which keys it refused."""
    if settings.session_provisioner != "ark-openapi" or not (settings.ark_access_key and settings.ark_secret_key):
        return None
    import asyncio

    import httpx

    from pipeline.session import ArkOpenAPIProvisioner
    from pipeline.session.exceptions import AuthError, SessionAPIError
    from pipeline.settings import env_name

    endpoint = settings.ark_openapi_url or "https://open.volcengineapi.com"

    async def call() -> str | None:
        assert settings.ark_access_key and settings.ark_secret_key
        provisioner = ArkOpenAPIProvisioner(
            access_key=settings.ark_access_key.get_secret_value(),
            secret_key=settings.ark_secret_key.get_secret_value(),
            agent_id=settings.session_agent_id,
            endpoint=endpoint,
            timeout=timeout,
            max_attempts=1,
        )
        try:
            await provisioner.delete_session(_PROBE_SESSION)
        except AuthError as exc:
            return (
                f"Volcengine OpenAPI at {redact_url(endpoint)} refused {env_name('ark_access_key')} / "
                f"{env_name('ark_secret_key')} ({exc.status}): sessions could not be created"
            )
        except (SessionAPIError, httpx.HTTPError, ValueError):
            return None  # unreachable now, or an answer that says nothing about the keys
        finally:
            await provisioner.aclose()
        return None

    return asyncio.run(call())
