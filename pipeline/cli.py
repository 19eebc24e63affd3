"""`switchboard`: up, worker, sim, topics, bench."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from pipeline.settings import Settings


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "sim":
        from pipeline.sim.cli import main as sim_main

        return sim_main(argv[1:])
    if argv and argv[0] == "bench":
        from pipeline.bench import main as bench_main

        return bench_main(argv[1:])
    parser = argparse.ArgumentParser(prog="switchboard", description="IM platforms ⇄ agent sessions, on Kafka.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="everything on this machine with embedded defaults")
    up.add_argument("--web-port", type=int, default=int(os.environ.get("SWITCHBOARD_WEB_PORT", "8080")))
    up.add_argument("--think", type=float, default=0.3, help="the simulator agent's think time, seconds")
    up.add_argument("--run-dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    worker = sub.add_parser("worker", help="run a worker (all settings from SWITCHBOARD_* / the TOML file)")
    worker.add_argument("--stages", default="ingest,dispatch,render,egress")
    worker.add_argument("--platforms", default=None, help="egress platforms (default: those of the configured bots)")
    sub.add_parser("sim", help="the reference session server (see `switchboard sim --help`)")
    sub.add_parser("bench", help="benchmarks (see `switchboard bench --help`)")
    topics = sub.add_parser("topics", help="topic declarations")
    topics.add_argument("action", choices=["apply", "check", "schemas"])
    args = parser.parse_args(argv)

    try:
        if args.command == "up":
            return _up(args)
        if args.command == "worker":
            return _worker(args)
        if args.command == "topics":
            return asyncio.run(_topics(args.action))
    except ValidationError as exc:
        print(f"switchboard: bad settings:\n{exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"switchboard: {exc}", file=sys.stderr)
        return 2
    return 1


def _settings() -> Settings:
    from pipeline.settings import Settings

    return Settings()


def _worker(args: argparse.Namespace) -> int:

    from pipeline.logs import configure_logging
    from pipeline.worker import DrainingWorker, create_app

    settings = _settings()
    configure_logging(settings.log_format, settings.log_level)
    if os.environ.get("SWITCHBOARD_EVENT_LOOP", "uvloop") == "uvloop":
        _use_uvloop()
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    platforms = [p.strip() for p in args.platforms.split(",")] if args.platforms else None
    app = create_app(settings, stages=stages, platforms=platforms)
    worker = DrainingWorker(app, loglevel=settings.log_level.lower(), quiet=True, redirect_stdouts=False)
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
    """uvloop for the worker's loops (Faust's consumer thread makes its own through the policy):
    the pipeline is event-loop bound, and uvloop's callbacks and socket writes cost far less."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.set_event_loop(asyncio.new_event_loop())


async def _topics(action: str) -> int:
    from pipeline import topics
    from pipeline.kafka import TopicSpec, apply_topics, check_topics

    if action == "schemas":
        for path in topics.write_schemas():
            print(f"wrote {path}")
        return 0
    settings = _settings()
    if not settings.kafka_bootstrap:
        raise ValueError("SWITCHBOARD_KAFKA_BOOTSTRAP is required")
    specs = [
        TopicSpec(name=d.name, partitions=d.partitions, replication_factor=settings.replication_factor, config=d.config)
        for d in topics.declarations(settings.platforms, settings.partitions)
    ]
    if action == "apply":
        report = await apply_topics(settings.kafka_bootstrap, specs)
        print(report)
        return 0
    drift = await check_topics(settings.kafka_bootstrap, specs)
    for item in drift:
        print(item)
    print("no drift" if not drift else f"{len(drift)} drift(s)")
    return 0 if not drift else 1


def _up(args: argparse.Namespace) -> int:
    from pipeline.stack import Stack

    async def run() -> None:
        stack = Stack(web_port=args.web_port, think=args.think, run_dir=args.run_dir)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        print("switchboard: starting the embedded stack…", flush=True)
        try:
            await stack.start()
            print("switchboard is up:", flush=True)
            for name, where in stack.describe():
                print(f"  {name:<12} {where}", flush=True)
            print("Ctrl-C stops everything.", flush=True)
            await stop.wait()
        finally:
            print("switchboard: stopping…", flush=True)
            await stack.stop()

    logging.basicConfig(level=logging.WARNING)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
