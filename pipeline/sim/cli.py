"""``switchboard sim``: run the reference session server until interrupted."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys

from pipeline.sim.server import SimServer
from pipeline.sim.settings import Faults, SimSettings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard sim",
        description=(
            "The reference agent-session server (docs/session-protocol.md): both profiles (ark under /api/v3, "
            "anthropic under /v1), the signed control plane, simulator directives and fault injection."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    parser.add_argument("--port", type=int, default=8787, help="port to listen on; 0 picks a free one (printed)")
    parser.add_argument(
        "--api-key", default="switchboard-sim-key", help="accepted key (Bearer for ark, x-api-key for anthropic)"
    )
    parser.add_argument("--think", type=float, default=0.0, help="the agent's think time per turn, seconds")
    parser.add_argument(
        "--ping-interval", type=float, default=15.0, help="seconds between `ping` frames on an idle event stream"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random faults and stream drops")
    parser.add_argument(
        "--openapi-ak", default="switchboard-sim-ak", help="access key the signed control plane (CreateSession) accepts"
    )
    parser.add_argument("--openapi-sk", default="switchboard-sim-sk", help="secret key of that access key")
    faults = parser.add_argument_group("fault injection (also POST /_sim/faults at runtime)")
    faults.add_argument("--latency-ms", type=float, default=0.0, help="added to every API answer, milliseconds")
    faults.add_argument("--rate-429", type=float, default=0.0, help="probability of a 429 answer to a POST of events")
    faults.add_argument("--retry-after", type=float, default=0.2, help="the Retry-After of a 429, seconds")
    faults.add_argument("--rate-500", type=float, default=0.0, help="probability of a 500 answer to a POST of events")
    faults.add_argument(
        "--accept-delay", type=float, default=0.0, help="store a POST of events, then answer it after this many s"
    )
    faults.add_argument(
        "--drop-stream-prob",
        type=float,
        default=0.0,
        help="probability, per frame during a turn, of cutting the stream",
    )
    return parser


def settings_from_args(args: argparse.Namespace) -> SimSettings:
    return SimSettings(
        api_key=args.api_key,
        think=args.think,
        ping_interval=args.ping_interval,
        seed=args.seed,
        openapi_credentials={args.openapi_ak: args.openapi_sk},
        faults=Faults(
            latency_ms=args.latency_ms,
            rate_429=args.rate_429,
            retry_after=args.retry_after,
            rate_500=args.rate_500,
            accept_delay=args.accept_delay,
            drop_stream_prob=args.drop_stream_prob,
        ),
    )


async def _serve(settings: SimSettings, host: str, port: int) -> None:
    server = SimServer(settings)
    bound = await server.start(host, port)
    print(f"switchboard sim listening on http://{host}:{bound} (ark: /api/v3, anthropic: /v1)", flush=True)
    print(f"port={bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_serve(settings_from_args(args), args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
