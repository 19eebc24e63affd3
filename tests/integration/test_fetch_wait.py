"""The consumer's fetch wait is the configured one on the real broker.

Faust's own driver hard-codes a 1.5 s fetch wait, and Tansu holds every fetch that long, so each
Kafka hop of a turn would take 0.75 s on average. Switchboard's driver builds the consumer with
`SWITCHBOARD_KAFKA_FETCH_MAX_WAIT_MS` (20 ms on the embedded Tansu). This reads each hop of a few
turns from the hop timestamps of the delivered replies. Measured on Tansu: with the 20 ms wait the
hops took 10-22 ms; with the driver forced to Faust's 1.5 s, 224-765 ms (median ~750).

The bound is a fraction of Faust's wait, not a speed: the median of 20 hops must be under a quarter
of 1.5 s. Held for Faust's wait it is about half of it; with the configured wait a loaded machine
has some 20 times the measured figure to spare before it fails. (Apache Kafka answers a pending
fetch when data arrives whatever the wait, so there the test only shows the hops are not held.)
How fast a hop is belongs to `switchboard bench` (the bare turn reports each hop's latency).
"""

from __future__ import annotations

import statistics

import pytest

from .console import ConsoleClient

pytestmark = pytest.mark.integration

# (from, to) hop timestamps of one Kafka hop each: im.inbound, session.input, session.events, im.outbound.
HOPS = (("ingress", "ingest"), ("ingest", "dispatch_in"), ("stream", "render"), ("render", "delivered_at"))
FAUSTS_FETCH_WAIT_MS = 1500.0  # faust's aiokafka driver hard-codes fetch_max_wait_ms=1500


async def test_every_kafka_hop_waits_the_configured_fetch_wait_not_fausts(console: ConsoleClient) -> None:
    durations: list[float] = []
    for n in range(5):
        chat = console.chat("fetch")
        await console.send(chat, f"hop {n} [sim:think=0]")
        (reply,) = await console.wait_for(chat, 1)
        hops = {**reply["hops"], "delivered_at": reply["delivered_at"]}
        durations.extend(hops[b] - hops[a] for a, b in HOPS)
    assert len(durations) == 20
    assert statistics.median(durations) < FAUSTS_FETCH_WAIT_MS / 4, sorted(durations)
