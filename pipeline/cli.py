"""`switchboard`: up, worker, sim, topics, bench.

Every command checks what it can before it starts anything slow (settings, the bots file, the web
port, Kafka and Redis) and reports each problem as one plain line naming the setting to change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pipeline.errors import SwitchboardError

if TYPE_CHECKING:
    from pipeline.settings import BotConfig, Settings
    from pipeline.stack import Stack

STAGES = "ingest,dispatch,render,egress"
# Exit codes: 2 bad settings or arguments, 1 something on this machine or the network is in the way.
EXIT_SETTINGS, EXIT_ENVIRONMENT = 2, 1


class Refused(SwitchboardError):
    """A command cannot start; each of `problems` is one plain line for the terminal."""

    def __init__(self, problems: list[str], code: int = EXIT_ENVIRONMENT) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.code = code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description="Switchboard: IM platforms ⇄ agent sessions, on Kafka.",
        epilog=(
            "Settings come from SWITCHBOARD_* variables and the bots file named by SWITCHBOARD_CONFIG "
            "(README.md, Configuration). `switchboard COMMAND --help` describes a command."
        ),
    )
    parser.add_argument("--version", action="version", version=f"switchboard {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    up = sub.add_parser(
        "up",
        help="everything on this machine: embedded broker, Redis, session simulator, one worker (what `make run` runs)",
        description=(
            "Start the embedded stack: a broker (Apache Kafka when Java 17+ is here, else Tansu; see "
            "--broker), a Redis server and the session simulator (each "
            "unless SWITCHBOARD_KAFKA_BOOTSTRAP, SWITCHBOARD_REDIS_URL or SWITCHBOARD_SESSION_BASE_URL "
            "names your own), then one worker with the web console, and says it is up once the worker's "
            "stages consume. Ctrl-C, a hang-up (closed terminal) or SIGTERM stops everything."
        ),
    )
    up.add_argument(
        "--web-port",
        type=int,
        default=None,
        metavar="PORT",
        help="port of the worker's web server: webhooks, console, /metrics (default: SWITCHBOARD_WEB_PORT, else 8080)",
    )
    up.add_argument(
        "--broker",
        choices=("auto", "kafka", "tansu"),
        default="auto",
        help=(
            "the embedded broker: `kafka` (Apache Kafka, a JVM: jars fetched with Maven on the first run; "
            "stays as fast after a day of traffic), `tansu` (in memory, starts at once; its fetches slow "
            "down after some ten thousand messages), `auto` (default): kafka when Java 17+ and Maven "
            "or the cached jars are here, else tansu"
        ),
    )
    up.add_argument("--think", type=float, default=0.3, help="the simulator agent's think time, seconds (default 0.3)")
    up.add_argument("--run-dir", type=Path, default=None, help="keep logs and data here (default: a new temp dir)")
    up.add_argument(
        "--onebot-ws",
        action="store_true",
        help=(
            "also configure a OneBot v11 bot `napcat` reached by reverse WebSocket on the worker (loopback): "
            "point a local NapCat's websocketClients at the URL and token the banner prints"
        ),
    )
    worker = sub.add_parser(
        "worker",
        help="run a worker (all settings from SWITCHBOARD_* and the bots file)",
        description=(
            "Run a worker: the Faust app with the chosen stages plus the web server (webhooks, console "
            "API, /metrics, /healthz, /readyz). Needs SWITCHBOARD_KAFKA_BOOTSTRAP, SWITCHBOARD_REDIS_URL "
            "and the session API settings; topics must exist (`switchboard topics apply`)."
        ),
    )
    worker.add_argument(
        "--stages",
        default=STAGES,
        help=f"comma-separated stages this worker runs (default: all, {STAGES})",
    )
    worker.add_argument(
        "--platforms",
        default=None,
        help="comma-separated platforms whose outbound topics egress consumes (default: those of the configured bots)",
    )
    sub.add_parser("sim", help="the reference session server (see `switchboard sim --help`)", add_help=False)
    sub.add_parser("bench", help="benchmarks that print their figures (see `switchboard bench --help`)", add_help=False)
    topics = sub.add_parser(
        "topics",
        help="create or check the Kafka topics; regenerate their JSON Schemas",
        description="The topic catalogue is pipeline/topics/topics.toml (partitions: SWITCHBOARD_PARTITIONS).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "actions:\n"
            "  apply    create missing topics and grow partitions on SWITCHBOARD_KAFKA_BOOTSTRAP (idempotent)\n"
            "  check    report drift between the catalogue and the cluster; exit 1 when there is any\n"
            "  schemas  rewrite the JSON Schemas in pipeline/topics/ from the record models"
        ),
    )
    topics.add_argument(
        "action", choices=["apply", "check", "schemas"], metavar="ACTION", help="apply, check or schemas (see below)"
    )
    topics.add_argument(
        "--brokers-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help=(
            "apply: how long to wait for SWITCHBOARD_REPLICATION_FACTOR brokers to register before refusing to "
            "create a topic with fewer replicas (default 60)"
        ),
    )
    from pipeline.operator.arguments import add_parsers

    add_parsers(sub.add_parser)  # deadletters, conversation
    return parser


def version() -> str:
    """The installed distribution's version (the package's own when it is run from a checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("switchboard")
    except PackageNotFoundError:
        from pipeline import __version__

        return __version__


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from pipeline.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "bench":
        from pipeline.bench import main as bench_main

        return bench_main(argv[1:])
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    from pipeline.errors import ConfigurationError
    from pipeline.settings import unknown_variables

    # Before anything else: a misspelt variable is otherwise ignored without a word.
    for warning in unknown_variables() if args.command in ("up", "worker", "topics", *OPERATOR_COMMANDS) else []:
        print(f"switchboard: warning: {warning}", file=sys.stderr)
    try:
        if args.command == "up":
            return _up(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "topics":
            return asyncio.run(_topics(args.action, args.brokers_timeout))
        if args.command in OPERATOR_COMMANDS:
            return _operator(args)
    except ConfigurationError as exc:
        count = len(exc.problems)
        _print_problems(f"bad settings ({count} problem{'s' if count > 1 else ''}):", exc.problems)
        return EXIT_SETTINGS
    except Refused as exc:
        _print_problems("", exc.problems)
        return exc.code
    parser.print_help()
    return EXIT_SETTINGS


OPERATOR_COMMANDS = ("deadletters", "conversation")


def _operator(args: argparse.Namespace) -> int:
    """`deadletters`, `conversation`: with the worker's settings, against its Kafka and Redis."""
    from aiokafka.errors import KafkaError

    from pipeline import preflight
    from pipeline.operator import commands
    from pipeline.platforms.checks import bot_problems
    from pipeline.records import now_ms
    from pipeline.settings import env_name, load_settings
    from pipeline.state import StateError

    # The arguments first: a mistake in them is said before anything is reached.
    if args.command == "deadletters" and (args.action == "show") != (args.position is not None):
        raise Refused(["deadletters: a POSITION goes with `show` only, and `show` needs one"], EXIT_SETTINGS)
    if args.command == "conversation" and not args.session and not (args.platform and args.bot and args.chat):
        raise Refused(
            ["conversation: give --platform, --bot and --chat (--user too for a session per user), or --session"],
            EXIT_SETTINGS,
        )
    try:
        if args.command == "deadletters":
            commands.letter_filter(args, now_ms())
    except commands.CommandError as exc:
        raise Refused([str(exc)], EXIT_SETTINGS) from None
    settings = load_settings(args.command, bots_check=bot_problems)
    assert settings.kafka_bootstrap and settings.redis_url  # load_settings requires them for these commands
    _check(
        preflight.kafka_problem(settings.kafka_bootstrap, env_name("kafka_bootstrap")),
        preflight.redis_problem(settings.redis_url, env_name("redis_url")),
    )
    run = commands.deadletters if args.command == "deadletters" else commands.conversation
    try:
        return asyncio.run(run(args, settings))
    except commands.CommandError as exc:
        raise Refused([str(exc)], EXIT_SETTINGS) from None
    except (KafkaError, StateError, ConnectionError, TimeoutError) as exc:  # lost Kafka or Redis meanwhile
        raise Refused([f"{args.command}: {type(exc).__name__}: {exc}"], EXIT_ENVIRONMENT) from None


def _print_problems(header: str, problems: list[str]) -> None:
    if header:
        print(f"switchboard: {header}", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return
    for problem in problems:
        print(f"switchboard: {problem}", file=sys.stderr)


def _check(*problems: str | None, code: int = EXIT_ENVIRONMENT) -> None:
    found = [p for p in problems if p]
    if found:
        raise Refused(found, code)


def _worker(args: argparse.Namespace) -> int:
    from pipeline import preflight
    from pipeline.platforms import known_platforms
    from pipeline.platforms.checks import bot_problems
    from pipeline.settings import env_name, load_settings
    from pipeline.web import worker_problems
    from pipeline.worker import ALL_STAGES

    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    platforms = [p.strip() for p in args.platforms.split(",") if p.strip()] if args.platforms else None
    _check(
        *(f"--stages: unknown stage {s!r}; known: {', '.join(ALL_STAGES)}" for s in stages if s not in ALL_STAGES),
        *(
            f"--platforms: unknown platform {p!r}; known: {', '.join(known_platforms())}"
            for p in platforms or []
            if p not in known_platforms()
        ),
        code=EXIT_SETTINGS,
    )
    settings = load_settings(
        "worker",
        bots_check=bot_problems,
        # The session settings as a whole, with the rest: every problem in one report.
        settings_check=lambda s: [*worker_problems(s), *preflight.session_problems(s)],
    )
    assert settings.kafka_bootstrap and settings.redis_url  # load_settings("worker") requires them
    _check(
        preflight.port_problem(
            settings.web_host, settings.web_port, f"set {env_name('web_port')} to a free port (0: any)"
        ),
        preflight.kafka_problem(settings.kafka_bootstrap, env_name("kafka_bootstrap")),
        preflight.redis_problem(settings.redis_url, env_name("redis_url")),
        preflight.session_api_problem(settings),
        preflight.ark_openapi_problem(settings),
    )
    if settings.kafka_idempotence:
        # One InitProducerId now: a broker without idempotent producers otherwise stops the worker
        # with aiokafka's bare `UnknownError` from deep inside Faust's start.
        from pipeline.kafka.refusals import idempotence_problem

        _check(asyncio.run(idempotence_problem(settings.kafka_bootstrap)), code=EXIT_SETTINGS)

    from pipeline.logs import configure_logging
    from pipeline.worker import DrainingWorker, create_app

    configure_logging(settings.log_format, settings.log_level)
    if os.environ.get("SWITCHBOARD_EVENT_LOOP", "uvloop") == "uvloop":
        _use_uvloop()
    app = create_app(settings, stages=stages, platforms=platforms)
    # override_logging=False: Faust would replace the handlers configure_logging set (JSON lines in
    # production, logger names that `switchboard up` filters on) with its own format.
    worker = DrainingWorker(
        app, loglevel=settings.log_level.lower(), quiet=True, redirect_stdouts=False, override_logging=False
    )
    worker.spinner = None  # Faust's start-up spinner writes control characters into the log
    worker.drain = app.drain
    profile_path = os.environ.get("SWITCHBOARD_CPROFILE")  # development aid: a cProfile dump at exit
    if not profile_path:
        worker.execute_from_commandline()
        return 0
    import cProfile
    import threading
    import time

    profiler = cProfile.Profile()

    def dump_every_few_seconds() -> None:  # Faust's shutdown may not return here
        while True:
            time.sleep(5)
            profiler.dump_stats(profile_path)

    threading.Thread(target=dump_every_few_seconds, daemon=True).start()
    profiler.enable()
    try:
        worker.execute_from_commandline()
    finally:
        profiler.disable()
        profiler.dump_stats(profile_path)
    return 0


def _use_uvloop() -> None:
    """uvloop for the worker's loop (the Kafka consumer runs on it too): the pipeline is event-loop
    bound, and uvloop's callbacks and socket writes cost far less."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.set_event_loop(asyncio.new_event_loop())


async def _topics(action: str, brokers_timeout: float = 60.0) -> int:
    from pipeline import preflight, topics
    from pipeline.kafka import apply_topics, check_topics
    from pipeline.platforms.checks import bot_problems
    from pipeline.redact import redact_url
    from pipeline.settings import env_name, load_settings

    if action == "schemas":
        for path in topics.write_schemas():
            print(f"wrote {path}")
        return 0
    settings = load_settings("topics", bots_check=bot_problems)
    assert settings.kafka_bootstrap  # load_settings("topics") requires it
    _check(preflight.kafka_problem(settings.kafka_bootstrap, env_name("kafka_bootstrap")))
    specs = topics.cluster_specs(settings)
    if action == "apply":
        # Never fewer replicas than asked for: a topic created with them keeps them until a
        # partition reassignment. A cluster still starting gets `brokers_timeout` to register.
        report = await apply_topics(
            settings.kafka_bootstrap, specs, cap_replication_factor=False, brokers_timeout=brokers_timeout
        )
        where = f"{redact_url(settings.kafka_bootstrap)}, {report.brokers} broker(s)"
        print(f"topics on {where}: {report.headline()}")
        for line in report.summary().splitlines():
            print(f"  {line}")
        if report.ok:
            return 0
        problems = [f"{len(report.errors)} topic(s) not created or not updated (FAILED above)"]
        if any("replication factor" in message for message in report.errors.values()):
            problems.append(
                f"start every broker and wait until all have registered, then apply again (--brokers-timeout "
                f"waits longer), or lower {env_name('replication_factor')} (now {settings.replication_factor})"
            )
        _print_problems("", problems)
        return EXIT_ENVIRONMENT
    drift = await check_topics(settings.kafka_bootstrap, specs)
    for item in drift:
        print(item)
    print("no drift" if not drift else f"{len(drift)} drift(s)")
    return 0 if not drift else 1


# -- up ------------------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    from pipeline import preflight
    from pipeline.platforms.checks import bot_problems
    from pipeline.settings import env_name, load_settings

    # A session API of your own (no simulator): its settings are checked as a worker checks them.
    settings = load_settings(
        "up",
        bots_check=bot_problems,
        settings_check=lambda s: preflight.session_problems(s) if s.session_base_url else [],
    )
    web_port = args.web_port if args.web_port is not None else settings.web_port
    onebot = _onebot_ws_bot(settings) if args.onebot_ws else None
    other = _suggest(web_port)
    how = (
        f'pick another with `switchboard up --web-port {other}` (`make run RUN_ARGS="--web-port {other}"`)'
        f" or {env_name('web_port')}={other}"
    )
    _check(
        preflight.port_problem(settings.web_host, web_port, how),
        settings.kafka_bootstrap and preflight.kafka_problem(settings.kafka_bootstrap, env_name("kafka_bootstrap")),
        settings.redis_url and preflight.redis_problem(settings.redis_url, env_name("redis_url")),
        settings.session_base_url and preflight.session_api_problem(settings),
        settings.session_base_url and preflight.ark_openapi_problem(settings),
    )
    broker = _embedded_broker(args.broker) if not settings.kafka_bootstrap else "tansu"
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="switchboard-up-"))
    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(_run_stack(web_port, args.think, run_dir, how, onebot, broker))
    return 0


def _embedded_broker(choice: str) -> Literal["kafka", "tansu"]:
    """The broker `up` starts. Tansu's in-memory log makes every fetch slower as it grows (after
    some ten thousand messages replies stall), so Apache Kafka is the default wherever it can run."""
    from pipeline.embedded import kafka_jars_cached, kafka_unavailable

    if choice == "tansu":
        return "tansu"
    reason = kafka_unavailable()
    if reason is not None:
        _check(reason if choice == "kafka" else None, code=EXIT_ENVIRONMENT)
        say(f"using the embedded Tansu broker ({reason}); it slows down after some ten thousand messages")
        return "tansu"
    if not kafka_jars_cached():
        say("fetching Apache Kafka's jars with Maven (the first run only; about a minute)…")
    return "kafka"


ONEBOT_WS_BOT = "napcat"


@dataclass(frozen=True)
class OneBotWs:
    """`up --onebot-ws`: the bots the stack's workers get (the configured ones plus a OneBot bot on
    reverse WebSocket, with an access token made for this run) and what the banner tells NapCat."""

    bots_json: str
    token: str


def _onebot_ws_bot(settings: Settings) -> OneBotWs:
    import secrets

    from pipeline.settings import BotConfig, env_name
    from pipeline.web import is_loopback

    host = settings.web_host
    not_loopback = f"--onebot-ws serves on loopback only; unset {env_name('web_host')} (now {host})"
    _check(
        None if is_loopback(host) else not_loopback,
        f"--onebot-ws adds the bot onebot/{ONEBOT_WS_BOT}, which the bots file has already"
        if settings.bot("onebot", ONEBOT_WS_BOT) is not None
        else None,
        code=EXIT_SETTINGS,
    )
    token = secrets.token_urlsafe(24)
    bot = BotConfig(
        platform="onebot",
        bot_id=ONEBOT_WS_BOT,
        transport="ws-reverse",
        language="en",
        credentials={"access_token": token},
    )
    bots = [_bot_json(b) for b in [*settings.bots, bot]]
    return OneBotWs(bots_json=json.dumps(bots), token=token)


def _bot_json(bot: BotConfig) -> dict[str, object]:
    """A bot as the workers read it back from `SWITCHBOARD_BOTS` (credentials in clear: only the
    child processes of this run see the variable)."""
    data = bot.model_dump(mode="json", exclude={"credentials"}, exclude_defaults=True)
    data["credentials"] = {name: value.get_secret_value() for name, value in bot.credentials.items()}
    return data


def _suggest(port: int) -> int:
    return port + 1 if 0 < port < 65535 else 8081


async def _run_stack(
    web_port: int,
    think: float,
    run_dir: Path,
    how_to_change_port: str,
    onebot: OneBotWs | None = None,
    broker: Literal["kafka", "tansu"] = "tansu",
) -> int:
    from pipeline.embedded import EmbeddedServiceError, PortInUseError
    from pipeline.stack import Stack

    settings_env = {"SWITCHBOARD_BOTS": onebot.bots_json} if onebot is not None else {}
    stack = Stack(settings_env=settings_env, web_port=web_port, think=think, run_dir=run_dir, embedded_broker=broker)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP too: a closed terminal or a dropped SSH connection hangs up the process group, and the
    # parts run in sessions of their own (they do not get it), so an `up` that simply died would
    # leave them all running, holding the ports.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    say(f"starting the embedded stack (logs in {run_dir})…")

    async def bring_up() -> None:
        await stack.start()
        # The worker serves as soon as it started, but its stages consume only once its consumer
        # group's join is done (seconds): "up" is announced when a message sent then is answered
        # as fast as the ones after it.
        say("waiting for the worker to join its consumer group…")
        await stack.workers[0].wait_consuming()

    code = 0
    try:
        start = asyncio.ensure_future(bring_up())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if not start.done():  # Ctrl-C while starting
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await start
            return 0
        stopped.cancel()
        try:
            start.result()
        except PortInUseError as exc:
            # Taken between the check and the worker's bind (or by one of the embedded parts).
            _print_problems("", [f"port {exc.port} on {exc.host}: address already in use; {how_to_change_port}"])
            return EXIT_ENVIRONMENT
        except EmbeddedServiceError as exc:
            _print_problems(*_start_failure(str(exc)))
            return EXIT_ENVIRONMENT
        _write_pid_file(stack, run_dir)
        _banner(stack, run_dir, onebot)
        code = await _watch(stack, stop)
    finally:
        say("stopping…")
        await stack.stop()
        _remove_pid_file(run_dir)
        say(f"stopped; logs kept in {run_dir}")
    return code


def _write_pid_file(stack: Stack, run_dir: Path) -> None:
    """This run's pids, for a later `up` refused the port: it names this run and how to stop it."""
    from pipeline.preflight import UP_PID_FILE

    parts = {name: part.pid for name, part in stack.parts() if part.pid is not None}
    with contextlib.suppress(OSError):
        (run_dir / UP_PID_FILE).write_text(json.dumps({"pid": os.getpid(), "parts": parts}))


def _remove_pid_file(run_dir: Path) -> None:
    from pipeline.preflight import UP_PID_FILE

    with contextlib.suppress(OSError):
        (run_dir / UP_PID_FILE).unlink()


def say(line: str) -> None:
    out(f"switchboard: {line}")


def out(line: str) -> None:
    """A line for the terminal. Once the terminal is gone (hung up: EIO; a closed pipe: EPIPE) the
    lines go nowhere: a failed write must not cut the stop of the stack short."""
    try:
        print(line, flush=True)
    except OSError:
        # Later writes, and the interpreter's flush at exit, go to /dev/null instead of failing.
        sys.stdout = open(os.devnull, "w")


def _start_failure(message: str, tail_lines: int = 15) -> tuple[str, list[str]]:
    """A supervisor's start error: its first line, and the end of the log it quotes."""
    first, _, log = message.partition("\n")
    return first, log.splitlines()[-tail_lines:]


def _banner(stack: Stack, run_dir: Path, onebot: OneBotWs | None = None) -> None:
    out("switchboard is up:")
    for name, where in stack.describe():
        out(f"  {name:<12} {where}")
    if onebot is not None:
        url = stack.workers[0].url.replace("http://", "ws://") + f"/onebot/ws/{ONEBOT_WS_BOT}"
        out(f"  {'onebot ws':<12} {url}  (reverse WebSocket of bot onebot/{ONEBOT_WS_BOT})")
        out(f"  {'':<12} access token {onebot.token}")
        out(
            f"  {'':<12} NapCat: network.websocketClients += "
            f'{{"url": "{url}", "token": "{onebot.token}", "messagePostFormat": "array"}}'
        )
    out(f"  {'logs':<12} {run_dir}")
    for name, part in stack.parts():
        out(f"  {'':<12}   {name:<9} {part.log_path}")
    out(
        "One line per delivered message appears below (no message bodies); the full worker log:\n"
        f"  tail -f {stack.workers[0].log_path}\n"
        "Ctrl-C stops everything."
    )


async def _watch(stack: Stack, stop: asyncio.Event) -> int:
    """Until Ctrl-C: echo the worker's turn lines and warnings; if a part dies, say so and stop."""
    follower = LogFollower(stack.workers[0].log_path)
    while not stop.is_set():
        for line in follower.new_lines():
            out(line)
        for name, part in stack.parts():
            if not part.is_running:
                say(f"the {name} exited (code {part.exit_code}); last lines of {part.log_path}:")
                for line in part.log_tail(15).splitlines():
                    out(f"  {line}")
                return EXIT_ENVIRONMENT
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.25)
    for line in follower.new_lines():
        out(line)
    return 0


# `2026-01-31 12:00:00,123 INFO pipeline.turns: …` (pipeline.logs, text format)
_TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d (?P<time>\d\d:\d\d:\d\d),\d+ (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<msg>.*)$"
)
_SHOWN_LEVELS = {"WARNING", "ERROR", "CRITICAL"}
# Terminal control: escape sequences and control characters (a program's output may carry some).
_ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


class LogFollower:
    """Reads a worker log as it grows and picks the lines worth a terminal: the per-turn lines
    (logger `pipeline.turns`) and warnings or errors, from either log format."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read(1 << 20)
        except OSError:
            return []
        self._offset += len(data)
        *complete, self._partial = (self._partial + data).split(b"\n")
        shown = (self.pick(raw.decode("utf-8", "replace")) for raw in complete)
        return [line for line in shown if line is not None]

    @staticmethod
    def pick(line: str) -> str | None:
        line = _ESCAPES.sub("", line)
        match = _TEXT_LINE.match(line)
        if match:
            time, level, logger, message = match["time"], match["level"], match["logger"], match["msg"]
        elif line.startswith("{"):
            try:
                entry = json.loads(line)
                time, level = str(entry["ts"])[11:19], str(entry["level"]).upper()
                logger, message = str(entry["logger"]), str(entry["msg"])
            except (ValueError, KeyError, TypeError):
                return None
        else:
            return None
        if logger == "pipeline.turns":
            return f"  {time} {message}"
        if level in _SHOWN_LEVELS:
            return f"  {time} {level} {logger}: {message}"
        return None


if __name__ == "__main__":
    sys.exit(main())
