"""Each Kafka hop of a turn split into its parts, for the pipeline and the bare turn side by side.

The stamps are those of `pipeline.hopstamps` (the pipeline's, with `SWITCHBOARD_HOP_STAMPS`) and
the bare worker's (the same names, always on). All processes run on one machine, so the wall-clock
stamps of different processes are comparable. Per hop into a stage, from the produce call of the
stage before it to its own next produce call:

  produce       the sending stage called produce → its producer saw the broker's acknowledgement
                (serialising, linger, the request, the broker's append, acks=all, the response)
  broker_fetch  acknowledged → the consuming stage was given the record: the broker's hold until
                the consumer's fetch returns it, the fetch itself, and any wait in the consumer
                (aiokafka's fetched buffer; in the pipeline also the stages the driver delivered
                that fetch's other topics to first). Negative when the consumer had it before the
                producer's callback ran: the broker answers both at once.
  sent_to_fetched  produce + broker_fetch, for records whose acknowledgement could not be joined
                (produced by another process)
  step          given → the stage's batch step returned (parse, one Redis call per batch); the bare
                turn has none
  queue         step done (bare: given) → the stage's work for the record started (the keyed
                executor's queue: behind its conversation's earlier work, or max_in_flight)
  handle        work started → the stage's next produce call (dispatch: → the session call, less
                the busy policy's wait; egress: → delivered)
  total         the hop from produce call to the stage's next produce call (the parts' sum)

Two rows have only a handle: `ingress` (webhook received → produce) and `stream` (the agent's idle
read → produce). Their sum with the busy wait and the agent's time is the end-to-end latency.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.bench.load import Delivery
from pipeline.bench.measure import summary

# Rows in the order a turn goes through them; the Kafka hops are named by the stage they go into.
ROWS = ("ingress", "ingest", "dispatch", "stream", "render", "egress")
KAFKA_HOPS = ("ingest", "dispatch", "render", "egress")
PARTS = ("produce", "broker_fetch", "sent_to_fetched", "step", "queue", "handle", "total")
# Where each stage's handle ends: its next produce (or the session call, or the delivery).
HANDLE_ENDS = {"ingest": "dispatch.sent", "dispatch": "dispatch", "render": "egress.sent", "egress": "delivered"}


def hop_parts(hops: Mapping[str, float], delivered_at: float) -> dict[str, dict[str, float]]:
    """One reply's parts per row, in ms; a part whose stamps are missing is left out."""
    h = dict(hops)
    h["delivered"] = delivered_at
    out: dict[str, dict[str, float]] = {}
    _between(out, "ingress", "handle", h, "ingress", "ingest.sent")
    _between(out, "stream", "handle", h, "stream", "render.sent")
    for row in ("ingress", "stream"):
        if row in out:
            out[row]["total"] = out[row]["handle"]
    wait = h["released"] - h["held"] if "held" in h and "released" in h else 0.0
    for stage in KAFKA_HOPS:
        sent, acked, fetched, stepped, started = (
            h.get(f"{stage}.{name}") for name in ("sent", "acked", "fetched", "stepped", "started")
        )
        end = h.get(HANDLE_ENDS[stage])
        if end is not None and stage == "dispatch":
            end -= wait  # the busy policy's hold is reported apart (busy_wait)
        parts: dict[str, float] = {}
        if sent is not None and acked is not None:
            parts["produce"] = acked - sent
        if acked is not None and fetched is not None:
            parts["broker_fetch"] = fetched - acked
        if sent is not None and fetched is not None:
            parts["sent_to_fetched"] = fetched - sent
        if fetched is not None and stepped is not None:
            parts["step"] = stepped - fetched
        ready = stepped if stepped is not None else fetched
        if ready is not None and started is not None:
            parts["queue"] = started - ready
        if started is not None and end is not None:
            parts["handle"] = end - started
        if sent is not None and end is not None:
            parts["total"] = end - sent
        if parts:
            out[stage] = parts
    return out


def _between(out: dict[str, dict[str, float]], row: str, part: str, h: Mapping[str, float], a: str, b: str) -> None:
    if a in h and b in h:
        out.setdefault(row, {})[part] = h[b] - h[a]


def hop_breakdown(deliveries: Iterable[Delivery]) -> dict[str, dict[str, dict[str, Any]]]:
    """p50/p90/p99 per row and part over the replies (not notices, not replayed records)."""
    values: dict[str, dict[str, list[float]]] = {}
    for d in deliveries:
        if d.kind != "reply" or "replay" in d.hops:
            continue
        for row, parts in hop_parts(d.hops, d.delivered_at).items():
            for part, value in parts.items():
                values.setdefault(row, {}).setdefault(part, []).append(value)
    return {
        row: {part: summary(values[row][part]) for part in PARTS if part in values[row]}
        for row in ROWS
        if row in values
    }


def compare_breakdowns(
    pipeline: Mapping[str, Mapping[str, Mapping[str, Any]]], bare: Mapping[str, Mapping[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """Per row and part: the pipeline's and the bare turn's p50/p99 (ms), their ratios and the
    pipeline's excess; then the parts where the pipeline's p50 and p99 exceed the bare turn's most."""
    rows: dict[str, dict[str, Any]] = {}
    excess: list[tuple[float, float, str]] = []
    for row in ROWS:
        p_row, b_row = pipeline.get(row) or {}, bare.get(row) or {}
        for part in PARTS:
            p, b = p_row.get(part), b_row.get(part)
            if not p and not b:
                continue
            entry: dict[str, Any] = {
                "pipeline": _pick(p),
                "bare": _pick(b),
                "ratio_p50": _ratio(_get(p, "p50"), _get(b, "p50")),
                "ratio_p99": _ratio(_get(p, "p99"), _get(b, "p99")),
                "excess_p50_ms": _diff(_get(p, "p50"), _get(b, "p50")),
                "excess_p99_ms": _diff(_get(p, "p99"), _get(b, "p99")),
            }
            rows.setdefault(row, {})[part] = entry
            if part not in ("total", "sent_to_fetched"):  # the parts themselves, not their sums
                e50: float | None = entry["excess_p50_ms"]
                e99: float | None = entry["excess_p99_ms"]
                if e50 is not None and e99 is not None:
                    excess.append((e50, e99, f"{row}.{part}"))
    return {
        "rows": rows,
        "largest_excess_p50": [
            {"part": name, "excess_p50_ms": e50} for e50, _, name in sorted(excess, reverse=True)[:3] if e50 > 0
        ],
        "largest_excess_p99": [
            {"part": name, "excess_p99_ms": e99}
            for e99, _, name in sorted(((e99, e50, n) for e50, e99, n in excess), reverse=True)[:3]
            if e99 > 0
        ],
    }


def format_breakdown(comparison: Mapping[str, Any], title: str) -> str:
    """The comparison as a text table (ms)."""
    lines = [
        title,
        f"  {'hop':9s}{'part':17s}{'pipeline p50/p99':>20s}{'bare p50/p99':>20s}{'ratio p50/p99':>16s}",
    ]
    for row, parts in (comparison.get("rows") or {}).items():
        for index, (part, e) in enumerate(parts.items()):
            label = row if index == 0 else ""
            lines.append(
                f"  {label:9s}{part:17s}{_pair(e['pipeline']):>20s}{_pair(e['bare']):>20s}"
                f"{_fmt(e['ratio_p50']) + ' / ' + _fmt(e['ratio_p99']):>16s}"
            )
    for key, unit in (("largest_excess_p50", "excess_p50_ms"), ("largest_excess_p99", "excess_p99_ms")):
        found = comparison.get(key) or []
        if found:
            named = ", ".join(f"{f['part']} +{f[unit]:.2f} ms" for f in found)
            lines.append(f"  pipeline over bare, {key.rsplit('_', 1)[1]}: {named}")
    return "\n".join(lines)


def _pick(figures: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not figures:
        return None
    return {k: figures.get(k) for k in ("n", "p50", "p99")}


def _get(figures: Mapping[str, Any] | None, key: str) -> float | None:
    value = (figures or {}).get(key)
    return float(value) if isinstance(value, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b is not None and b > 0 else None


def _diff(a: float | None, b: float | None) -> float | None:
    return round(a - b, 2) if a is not None and b is not None else None


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _pair(figures: Mapping[str, Any] | None) -> str:
    if not figures or figures.get("p50") is None:
        return "-"
    return f"{figures['p50']:.2f} / {figures['p99']:.2f}"
