"""Simulator settings and the runtime-mutable fault-injection knobs."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass(slots=True)
class Faults:
    """Everything ``POST /_sim/faults`` can change at runtime (unknown keys are rejected)."""

    latency_ms: float = 0.0  # added to every data-plane request
    rate_429: float = 0.0  # probability that POST events answers 429 (before accepting)
    retry_after: float = 0.2  # seconds, sent with every 429
    rate_500: float = 0.0  # probability that POST events answers 500 (before accepting)
    accept_delay: float = 0.0  # POST events: accept at once, answer only after this many seconds
    drop_stream_prob: float = 0.0  # per delivered frame during a turn: drop that stream first
    seed: int | None = None  # reseeds the RNG when set

    def update(self, changes: dict[str, Any]) -> None:
        names = {f.name for f in fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise ValueError(f"unknown fault settings: {sorted(unknown)}")
        for name, value in changes.items():
            if name == "seed":
                self.seed = None if value is None else int(value)
            else:
                setattr(self, name, float(value))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class SimSettings:
    api_key: str = "switchboard-sim-key"
    think: float = 0.0  # default think time per turn, seconds
    ping_interval: float = 15.0  # SSE keep-alive `event: ping`
    seed: int = 0
    agent_name: str = "sim-agent"
    delta_chunk: int = 8  # characters per event_delta frame
    # Volcengine OpenAPI credentials accepted by the control plane (access key -> secret key).
    openapi_credentials: dict[str, str] = field(default_factory=lambda: {"switchboard-sim-ak": "switchboard-sim-sk"})
    faults: Faults = field(default_factory=Faults)
