"""`switchboard bench`: load through the real ingress, the bare-Kafka limit, the bare turn, scaling
and chaos.

    switchboard bench                                   # load + limit + bare turn (embedded Tansu, 1 worker)
    switchboard bench --mode max                        # ramp until latency or errors blow up
    switchboard bench --scale --memory --streams 10000  # 1→2 workers, rebalance, memory, SSE streams
    switchboard bench --broker both                     # Tansu vs Apache Kafka
    switchboard bench --chaos                           # faults under load; lost/duplicated accounting
    switchboard bench --scale-workers 1,2,4 --pin-workers 1 --pin-others 0   # capacity model check
    switchboard bench --chaos --redis cluster           # the same on a Redis Cluster (a primary killed)
    switchboard bench --chaos --kafka-cluster 3 --chaos-kill leader,rolling   # broker faults, lag recovery
    switchboard bench --attach http://127.0.0.1:8080 --worker-pid 1234   # a running stack (env settings)
    switchboard bench --soak                            # an hour at 80 msg/s, per 5-minute window: latency, RSS, Redis
    switchboard bench --flood --flood-rate 300          # one chat floods: the other chats' overhead ratio

Writes bench/results/<name>.json and .png (see bench/README.md for every field).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

#: defaults of the load phase, and of `--soak` (pipeline/bench/soak.py)
LOAD_RATE = 150.0
LOAD_DURATION = 20.0
#: Half the worker's max: 165 turns/s measured on the 2-core reference machine, so `--soak` without
#: `--rate` offers 80 msg/s. Deriving it per run would need a ramp first (minutes of overload right
#: before the soak, a noisy figure on a shared machine); `--rate` overrides.
SOAK_RATE = 80.0
SOAK_DURATION = 3600.0
SOAK_WINDOW = 300.0
SOAK_WARMUP = 300.0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="switchboard bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--attach",
        action="append",
        default=[],
        metavar="URL",
        help="worker URL of a running stack (repeat); Redis/Kafka from SWITCHBOARD_* env",
    )
    p.add_argument("--worker-pid", action="append", type=int, default=[], help="pid(s) of attached workers (CPU/RSS)")
    p.add_argument("--broker", choices=["tansu", "kafka", "both"], default="tansu")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--mode", choices=["fixed", "max"], default="fixed")
    p.add_argument(
        "--rate",
        type=float,
        default=None,
        help=f"offered inbound messages/s (fixed mode; default {LOAD_RATE:g}, with --soak {SOAK_RATE:g})",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=None,
        help=f"seconds of load per phase (default {LOAD_DURATION:g}; with --soak the whole soak, {SOAK_DURATION:g})",
    )
    p.add_argument(
        "--warm-load",
        type=float,
        default=None,
        metavar="S",
        help="seconds of unmeasured load at the offered rate before the measured phases (fixed mode and "
        "--flood): Apache Kafka's JVM compiles its hot paths in its first minute, on the same cores, and "
        "would slow whichever phase runs first (default 30 on --broker kafka, 0 on Tansu)",
    )
    p.add_argument("--conversations", type=int, default=200)
    p.add_argument("--private-share", type=float, default=0.3, help="share of conversations that are private")
    p.add_argument("--filtered-share", type=float, default=0.8, help="share of group messages without @bot")
    p.add_argument("--burst-prob", type=float, default=0.02, help="probability an arrival is a burst into one chat")
    p.add_argument("--burst-size", type=int, default=5)
    p.add_argument("--think", type=float, default=0.1, help="simulated agent think time, seconds")
    p.add_argument("--bot", default="demo", help="demo (busy policy merge) or queue")
    p.add_argument("--log-level", default="WARNING", help="worker log level")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra setting for the stack's workers, e.g. SWITCHBOARD_EVENT_LOOP=asyncio (repeat)",
    )
    p.add_argument("--no-limit", action="store_true", help="skip the bare aiokafka chain")
    p.add_argument(
        "--no-bare-turn",
        action="store_true",
        help="skip the bare turn (a turn's I/O hand-written with aiohttp and aiokafka, at the same rate and its max)",
    )
    p.add_argument("--limit-messages", type=int, default=20_000)
    p.add_argument("--filtered", action="store_true", help="also a phase of only non-triggering group messages")
    p.add_argument(
        "--filtered-messages",
        type=int,
        default=50_000,
        help="with --filtered: non-triggering messages produced straight into im.inbound for the backlog drain",
    )
    p.add_argument("--ramp-start", type=float, default=50.0)
    p.add_argument("--ramp-factor", type=float, default=1.5)
    p.add_argument(
        "--ramp-steps",
        type=int,
        default=10,
        help="at most this many steps; the ramp stops at the first failing one (10 steps of 1.5x from 50 reach "
        "1,922 msg/s: 8, to 854 msg/s, no longer found the pipeline's or the bare turn's ceiling)",
    )
    p.add_argument(
        "--ramp-refine",
        type=int,
        default=1,
        help="after the first failing step, this many steps between the highest rate that passed and the lowest "
        "that failed (their geometric mean each), so a max is found to within 1.22x (1: the default) or 1.11x (2) "
        "rather than --ramp-factor",
    )
    p.add_argument("--step-seconds", type=float, default=10.0)
    p.add_argument("--max-p99-ms", type=float, default=3000.0, help="ramp stops above this end-to-end p99")
    p.add_argument("--scale", action="store_true", help="1 vs 2 workers (ramp) and rebalance under load")
    p.add_argument(
        "--scale-workers",
        default="",
        metavar="N,N,…",
        help="capacity: per-turn costs of every process and the ramp's max with each worker count (e.g. 1,2,4), "
        "checked against the capacity model; only this runs",
    )
    p.add_argument("--pin-workers", default="", metavar="CPUS", help="with --scale-workers: the workers' CPUs (e.g. 1)")
    p.add_argument(
        "--pin-others",
        default="",
        metavar="CPUS",
        help="with --scale-workers: CPUs of the broker, Redis, simulator and the bench itself (e.g. 0)",
    )
    p.add_argument(
        "--filtered-rate", type=float, default=400.0, help="with --scale-workers: msg/s of the filtered-only phase"
    )
    p.add_argument("--memory", action="store_true", help="worker RSS per idle conversation")
    p.add_argument("--idle-conversations", type=int, default=2000)
    p.add_argument("--streams", type=int, default=0, metavar="N", help="hold N turns open (long think); RSS")
    p.add_argument("--with-load", action="store_true", help="with --chaos/--streams: run the load phases too")
    p.add_argument("--chaos", action="store_true", help="faults under load, then account for every message")
    p.add_argument("--chaos-duration", type=float, default=90.0)
    p.add_argument("--kill-every", type=float, default=10.0)
    p.add_argument(
        "--redis",
        choices=["single", "cluster", "sentinel"],
        default="single",
        help="with --chaos: one Redis (restarted), a Redis Cluster of 3 primaries + 3 replicas or a Sentinel"
        " primary + replica + 3 sentinels (on both: the primary SIGKILLed, its replica promoted)",
    )
    p.add_argument("--chaos-rate", type=float, default=20.0)
    p.add_argument(
        "--kafka-cluster",
        type=int,
        default=0,
        metavar="N",
        help="with --chaos: run on a replicated Apache Kafka cluster of N KRaft nodes (3 replicas, 2 in sync)",
    )
    p.add_argument(
        "--chaos-kill",
        default="",
        metavar="leader,rolling",
        help="with --kafka-cluster: broker faults in order instead of the worker/Redis/API faults: `leader` "
        "SIGKILLs the node leading most partitions and brings it back, `rolling` restarts every node in turn",
    )
    p.add_argument("--broker-down-for", type=float, default=15.0, help="seconds the killed leader stays down")
    p.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="S",
        help="py-spy record the worker for S seconds during the load (raw folded output)",
    )
    p.add_argument(
        "--soak",
        action="store_true",
        help="only a soak: steady load for --duration (an hour) at --rate (half the worker's max), figures per "
        "--window, judged against the long-run targets after --warmup (bench/README.md)",
    )
    p.add_argument("--window", type=float, default=SOAK_WINDOW, metavar="S", help="with --soak: seconds per window")
    p.add_argument(
        "--warmup",
        type=float,
        default=SOAK_WARMUP,
        metavar="S",
        help="with --soak: seconds of the soak before the targets are judged (its windows are reported, not judged)",
    )
    p.add_argument(
        "--flood",
        action="store_true",
        help="fairness: the normal load alone, then beside one chat flooding triggering messages (only that)",
    )
    p.add_argument("--flood-rate", type=float, default=300.0, help="with --flood: the flooding chat's messages/s")
    p.add_argument(
        "--flood-limit",
        default=None,
        metavar="COUNT/SECONDS",
        help="with --flood: both phases on a bot `limited` (busy policy merge) whose chats may start COUNT turns "
        "per SECONDS (`[bots.limits] chat_turns`, notice on): the flooding chat's excess is refused at ingest",
    )
    p.add_argument("--quick", action="store_true", help="tiny load for a smoke test (a few seconds)")
    p.add_argument("--out", type=Path, default=None, help="results directory (default bench/results)")
    p.add_argument("--name", default=None, help="result file name (default bench-<timestamp>)")
    p.add_argument("--run-dir", type=Path, default=None, help="keep the stack's logs here")
    return p


def apply_mode_defaults(args: argparse.Namespace) -> None:
    """`--rate` and `--duration` not given: the load phase's defaults, or the soak's."""
    if args.rate is None:
        args.rate = SOAK_RATE if args.soak else LOAD_RATE
    if args.duration is None:
        args.duration = SOAK_DURATION if args.soak else LOAD_DURATION


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.chaos_kill:
        from pipeline.bench.chaos_kafka import parse_broker_faults

        try:
            args.chaos_kill = parse_broker_faults(args.chaos_kill)
        except ValueError as exc:
            parser.error(str(exc))
        if args.kafka_cluster < 2:
            parser.error("--chaos-kill needs --kafka-cluster N, N >= 2 (one broker has no replica to fail over to)")
    apply_mode_defaults(args)
    if args.soak and (args.window <= 0 or args.duration <= 0 or args.rate <= 0):
        parser.error("--soak needs a positive --duration, --window and --rate")
    if args.quick:
        args.rate, args.duration, args.conversations = min(args.rate, 20.0), min(args.duration, 4.0), 10
        args.limit_messages = min(args.limit_messages, 2000)
        args.think = min(args.think, 0.05)
        args.ramp_steps, args.step_seconds = min(args.ramp_steps, 2), min(args.step_seconds, 3.0)
        args.ramp_refine = 0
    from pipeline.bench.main import run

    try:
        result = asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    return 0 if result.get("ok", True) else 1


__all__ = ["apply_mode_defaults", "build_parser", "main"]


def _now() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def default_name(args: Any) -> str:
    return args.name or f"bench-{_now()}"
