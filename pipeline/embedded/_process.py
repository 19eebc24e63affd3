"""Process supervision shared by the embedded services (Tansu, Redis, Apache Kafka).

A service is a child process started with ``subprocess.Popen`` (not ``asyncio.create_subprocess_exec``)
so it is not tied to one event loop: pytest session fixtures start services synchronously, outside any
loop, while the tests that use them each run in their own loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from pipeline.embedded.exceptions import PortInUseError, ServiceStartError, ServiceStopError

T = TypeVar("T")

# Every supervisor still running when the interpreter exits is killed, so a crashed test run does not
# leave brokers listening on the machine (CI runs on the session's own machine). A strong set: a
# supervisor dropped without stop() must still be found here.
_LIVE: set[ManagedProcess] = set()


@atexit.register
def _kill_leftovers() -> None:
    for svc in list(_LIVE):
        with contextlib.suppress(Exception):
            svc.kill_now()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to port 0 and let the kernel choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports that were free a moment ago: every socket stays bound until all
    are chosen (two `free_port` calls in a row can return the same port)."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(int(s.getsockname()[1]))
        return ports


def port_open(host: str, port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code.

    Uses ``asyncio.run`` when no loop is running in this thread, otherwise a helper thread with its own
    loop (a sync context manager may be entered from code that is itself driven by a loop).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = asyncio.run(coro)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=target, name="switchboard-run-sync", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


class ManagedProcess:
    """Base class: one supervised child process with a log file in a run directory.

    Subclasses implement :meth:`_command` (argv, called on every start so ports are current) and
    :meth:`_probe` (one readiness attempt; raise or return False while not ready). Lifecycle:

    * ``await svc.start()`` / ``await svc.stop()`` / ``await svc.restart()``, or
    * ``with svc:`` (sync) / ``async with svc:``.

    ``stop`` sends SIGTERM, waits ``stop_grace`` seconds, then SIGKILLs. ``restart`` keeps the port and
    the run directory (so a service with on-disk data comes back with it).
    """

    name = "service"
    #: seconds to wait for readiness after spawning
    start_timeout = 30.0
    #: seconds between SIGTERM and SIGKILL
    stop_grace = 10.0
    #: bound on one readiness probe (a probe talking to a wrong listener must not hang the start)
    probe_timeout = 5.0
    #: log lines that mean "port taken" (compared case-insensitively): retried on a new port when
    #: the port was picked by us, else a `PortInUseError`
    _port_in_use_markers: Sequence[str] = (
        "address already in use",  # redis-server, java.net.BindException, aiohttp (the worker)
        "address in use",  # Tansu: Os { code: 98, kind: AddrInUse, message: "Address in use" }
        "addrinuse",
    )

    def __init__(self, *, run_dir: str | os.PathLike[str] | None = None, keep_run_dir: bool | None = None):
        self._owns_run_dir = run_dir is None
        self._run_dir_arg = Path(run_dir) if run_dir is not None else None
        self._run_dir: Path | None = self._run_dir_arg
        if keep_run_dir is None:
            keep_run_dir = os.environ.get("SWITCHBOARD_KEEP_RUN_DIRS", "") not in ("", "0")
        self._keep_run_dir = keep_run_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0
        self._log_handle: Any = None
        #: whether the port was chosen by us (then a lost bind race is retried on another port)
        self._port_is_ours = True
        self.started_at: float | None = None
        #: wall time of the last successful start (spawn → ready), seconds
        self.last_start_seconds: float | None = None

    # -- subclass hooks ---------------------------------------------------------------------------
    def _command(self) -> list[str]:
        raise NotImplementedError

    def _env(self) -> dict[str, str] | None:
        return None

    async def _probe(self) -> bool:
        raise NotImplementedError

    def _prepare(self) -> None:
        """Called before each spawn (after the run dir exists): write configs, format storage..."""

    def _pick_new_port(self) -> None:
        """Choose new free port(s) after a lost bind race."""

    def _ports(self) -> list[tuple[str, int]]:
        """(host, port) pairs the service listens on; checked to be free before spawning."""
        return []

    # -- properties -------------------------------------------------------------------------------
    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"switchboard-{self.name}-"))
        return self._run_dir

    @property
    def log_path(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def exit_code(self) -> int | None:
        """The process's exit status once it has exited (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "<no log>"
        return "\n".join(text.splitlines()[-lines:])

    def current_log(self, limit: int = 64 * 1024) -> str:
        """Output of the current (or last) run only, at most ``limit`` bytes from its start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                return f.read(limit).decode(errors="replace")
        except OSError:
            return ""

    def _port_taken(self) -> bool:
        log = self.current_log().lower()
        return any(m.lower() in log for m in self._port_in_use_markers)

    def _port_in_use(self, detail: str = "") -> PortInUseError:
        host, port = self._ports()[0] if self._ports() else ("?", 0)
        return PortInUseError(self.name, host, port, detail)

    # -- lifecycle --------------------------------------------------------------------------------
    def _spawn(self) -> None:
        self._reap()  # a previous process that died on its own: close its log handle
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._prepare()
        argv = self._command()
        self._log_handle = open(self.log_path, "ab")  # closed in _reap
        self._log_offset = self._log_handle.tell()  # where this run's output starts
        self._log_handle.write(f"\n--- {time.strftime('%H:%M:%S')} start: {' '.join(argv)}\n".encode())
        self._log_handle.flush()
        env = self._env()
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
            env={**os.environ, **env} if env is not None else None,
            # Own process group: a Ctrl-C in the terminal goes to the test runner, which then stops
            # the service in order instead of the service dying mid-test.
            start_new_session=True,
        )
        _LIVE.add(self)

    async def start(self) -> Self:
        """Spawn the process and wait until it is ready. Idempotent while running."""
        if self.is_running:
            return self
        attempts = 3 if self._port_is_ours else 1
        last_error: Exception | None = None
        for _attempt in range(attempts):
            busy = [(h, p) for h, p in self._ports() if port_open(h, p)]
            if busy:
                # Someone already listens there: probing would talk to them, not to our service.
                if self._port_is_ours:
                    self._pick_new_port()
                    continue
                raise PortInUseError(self.name, *busy[0])
            t0 = time.monotonic()
            self._spawn()
            try:
                await self._wait_ready()
            except ServiceStartError as exc:
                last_error = exc
                self.kill_now()
                if self._port_taken():
                    if self._port_is_ours:
                        self._pick_new_port()  # lost a race for the port: try another one
                        continue
                    if not isinstance(exc, PortInUseError):
                        raise self._port_in_use(f"log {self.log_path}") from exc
                raise
            except BaseException:
                self.kill_now()  # cancelled (e.g. a test timeout): leave no half-started process
                raise
            self.started_at = time.time()
            self.last_start_seconds = time.monotonic() - t0
            return self
        raise last_error or ServiceStartError(f"{self.name}: no free port found in {attempts} attempts")

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        last_exc: BaseException | None = None
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise ServiceStartError(
                    f"{self.name} exited during start (code {code}); log {self.log_path}:\n{self.log_tail()}"
                )
            if self._port_taken():
                # Fail fast: the probe would talk to whoever holds the port (and may hang on it).
                raise self._port_in_use(f"log {self.log_path}")
            try:
                if await asyncio.wait_for(self._probe(), timeout=self.probe_timeout):
                    return
            except Exception as exc:  # not ready yet: remember why for the timeout message
                last_exc = exc
            if time.monotonic() > deadline:
                raise ServiceStartError(
                    f"{self.name} not ready after {self.start_timeout:.0f}s (last probe error: {last_exc!r});"
                    f" log {self.log_path}:\n{self.log_tail()}"
                )
            await asyncio.sleep(0.1)

    async def health(self) -> bool:
        """True when the process is alive and answers its readiness probe."""
        if not self.is_running:
            return False
        try:
            return await asyncio.wait_for(self._probe(), timeout=5)
        except Exception:
            return False

    async def stop(self) -> None:
        """SIGTERM, wait ``stop_grace`` seconds, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace
            # Polling is the only way to wait on a Popen without tying it to one event loop.
            while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                self._signal(signal.SIGKILL)
                deadline = time.monotonic() + 10
                while proc.poll() is None and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.05)
        self._reap()
        if proc.poll() is None:
            raise ServiceStopError(f"{self.name} (pid {proc.pid}) survived SIGKILL")

    async def kill(self) -> None:
        """SIGKILL at once (crash simulation); the run dir is kept so ``start`` can bring it back."""
        self.kill_now()

    async def restart(self) -> Self:
        """Stop, then start on the same port(s) with the same run dir."""
        await self.stop()
        chosen, self._port_is_ours = self._port_is_ours, False  # the port is now part of the contract with clients
        try:
            return await self.start()
        finally:
            self._port_is_ours = chosen

    def _signal(self, sig: int) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        # Our own child's process group (we started it in a new session), which includes the child:
        # one signal, not two. A second SIGTERM means "stop now" to a worker, cutting its drain short.
        try:
            os.killpg(proc.pid, sig)
            return
        except (ProcessLookupError, PermissionError):
            pass
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)

    @property
    def keep_run_dir(self) -> bool:
        """Whether the run directory stays after `cleanup` (for a look at its logs)."""
        return bool(self._keep_run_dir)

    def kill_now(self) -> None:
        """SIGKILL the process, if it runs (no wait for it to stop)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self._reap()

    def _reap(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            _LIVE.discard(self)
        if self._log_handle is not None:
            with contextlib.suppress(OSError):
                self._log_handle.close()
            self._log_handle = None

    def cleanup(self) -> None:
        """Remove the run directory if this object created it (and keeping was not asked for)."""
        if self.is_running:
            raise RuntimeError(f"{self.name} still running; stop it first")
        if self._owns_run_dir and not self._keep_run_dir and self._run_dir is not None:
            shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None

    # -- sync API / context managers --------------------------------------------------------------
    def start_sync(self) -> Self:
        return run_sync(self.start())

    def stop_sync(self) -> None:
        run_sync(self.stop())

    def restart_sync(self) -> Self:
        return run_sync(self.restart())

    def __enter__(self) -> Self:
        return self.start_sync()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop_sync()
        finally:
            self.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.stop()
        finally:
            self.cleanup()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.is_running else "stopped"
        return f"<{type(self).__name__} {state} run_dir={self._run_dir}>"


class ProcessGroup:
    """Base class of services made of several `ManagedProcess`es (a Redis Cluster, a Sentinel
    topology): subclasses implement `start` and `stop`; this adds ``with`` and ``async with``."""

    async def start(self) -> Self:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return run_sync(self.start())

    def __exit__(self, *exc: object) -> None:
        run_sync(self.stop())

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
