"""A real Apache Kafka broker (KRaft, one node acting as broker and controller): `switchboard up`'s
broker wherever Java 17+ runs, and the tests' second broker.

The broker's jars come from Maven Central through Maven (``kafka-pom.xml`` beside this module,
shipped in the package), are cached in ``~/.m2`` and copied once into
``~/.cache/switchboard/kafka-<version>/libs``; after that a start is only the JVM boot (about 3-4 s
here). Slower to start than Tansu, so the test fixtures only use it when
``SWITCHBOARD_TEST_BROKERS`` names ``kafka``.

Unlike Tansu, Apache Kafka answers a fetch as soon as data arrives (latency does not depend on
``fetch_max_wait_ms``), supports AlterConfigs/CreatePartitions, keeps data on disk across
``restart()`` and does not auto-create topics on Metadata requests from admin clients.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from pipeline.embedded._kafka_probe import kafka_ready
from pipeline.embedded._process import ManagedProcess, free_ports
from pipeline.embedded.exceptions import BinaryNotFoundError, ServiceStartError

DEFAULT_KAFKA_VERSION = "4.4.0"

_LOG4J2_YAML = """\
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaRaftServer
        level: INFO
      - name: kafka.server.BrokerServer
        level: INFO
"""


def kafka_pom_path() -> Path:
    explicit = os.environ.get("SWITCHBOARD_KAFKA_POM")
    return Path(explicit) if explicit else Path(__file__).with_name("kafka-pom.xml")


def kafka_cache_dir(version: str) -> Path:
    base = os.environ.get("SWITCHBOARD_CACHE_DIR") or os.path.join(Path.home(), ".cache", "switchboard")
    return Path(base) / f"kafka-{version}"


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise BinaryNotFoundError("Apache Kafka needs a Java 17+ runtime: no `java` on PATH or in JAVA_HOME")
    return found


def java_major_version(java: str) -> int:
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return 0
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def ensure_kafka_jars(version: str = DEFAULT_KAFKA_VERSION, *, timeout: float = 900) -> Path:
    """Return a directory holding the broker's jars, fetching them with Maven on first use.

    ``$SWITCHBOARD_KAFKA_LIBS`` may point at an existing classpath directory (e.g. a Kafka
    distribution's ``libs/``) to skip Maven entirely.
    """
    explicit = os.environ.get("SWITCHBOARD_KAFKA_LIBS")
    if explicit:
        return Path(explicit)
    libs = kafka_cache_dir(version) / "libs"
    stamp = libs / ".complete"
    if stamp.exists():
        return libs
    mvn = shutil.which("mvn")
    if not mvn:
        raise BinaryNotFoundError(
            "fetching Apache Kafka needs Maven (`mvn`) on PATH (apt-get install maven), "
            "or SWITCHBOARD_KAFKA_LIBS pointing at a Kafka libs/ directory"
        )
    pom = kafka_pom_path()
    if not pom.exists():
        raise BinaryNotFoundError(f"Kafka pom not found at {pom} (set SWITCHBOARD_KAFKA_POM)")
    tmp = libs.with_name(f"libs.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={tmp}",
        "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
        shutil.rmtree(tmp, ignore_errors=True)
        raise ServiceStartError(
            f"mvn could not fetch Apache Kafka {version} (exit {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    (tmp / ".complete").write_text(f"{version} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    # Atomic publish: a concurrent fetch of the same version simply loses the rename race.
    try:
        tmp.rename(libs)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return libs


def kafka_unavailable(version: str = DEFAULT_KAFKA_VERSION) -> str | None:
    """Why an embedded Apache Kafka cannot start here (None: it can): no Java 17+, or its jars
    neither cached nor fetchable (no Maven)."""
    try:
        java = java_binary()
    except BinaryNotFoundError as exc:
        return str(exc)
    if java_major_version(java) < 17:
        return f"Apache Kafka {version} needs Java 17+; {java} is older"
    if not kafka_jars_cached(version):
        if not shutil.which("mvn"):
            return "fetching Apache Kafka needs Maven (`mvn`) on PATH"
        if not kafka_pom_path().exists():
            return f"the Kafka pom is missing ({kafka_pom_path()})"
    return None


def kafka_jars_cached(version: str = DEFAULT_KAFKA_VERSION) -> bool:
    return bool(os.environ.get("SWITCHBOARD_KAFKA_LIBS")) or (kafka_cache_dir(version) / "libs" / ".complete").exists()


def random_cluster_id() -> str:
    """A Kafka cluster id: base64url of 16 random bytes, unpadded, never starting with ``-`` (as
    ``kafka-storage random-uuid``): ``kafka-storage format -t -abc…`` would read the id as an option."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class ApacheKafka(ManagedProcess):
    """Apache Kafka in KRaft combined mode on 127.0.0.1 free ports.

    Data lives in ``run_dir/data``; it is formatted on the first start and kept by ``restart()``.
    """

    name = "kafka"
    start_timeout = 120.0
    stop_grace = 20.0
    kind = "kafka"
    #: Apache Kafka answers a fetch early, so the wait only bounds idle polling
    recommended_fetch_max_wait_ms = 500
    #: same keys as TansuBroker's; the broker allows 2 s sessions (group.min.session.timeout.ms below)
    recommended_consumer_config: dict[str, int] = {
        "fetch_max_wait_ms": 500,
        "session_timeout_ms": 2000,
        "heartbeat_interval_ms": 300,
    }
    supports_alter_configs = True
    supports_idempotence = True
    supports_create_partitions = True
    persistent = True

    def __init__(
        self,
        *,
        version: str = DEFAULT_KAFKA_VERSION,
        port: int | None = None,
        controller_port: int | None = None,
        host: str = "127.0.0.1",
        heap: str = "512m",
        auto_create_topics: bool = True,
        extra_properties: dict[str, str] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        keep_run_dir: bool | None = None,
        node_id: int = 1,
        cluster_id: str | None = None,
        quorum_voters: str | None = None,
        replicas: int = 1,
    ) -> None:
        """``node_id``, ``cluster_id``, ``quorum_voters`` (``id@host:port,...``) and ``replicas``
        (the internal topics' replication factor) make this one node of a :class:`KafkaCluster`;
        the defaults are a single node that is its own quorum."""
        super().__init__(run_dir=run_dir, keep_run_dir=keep_run_dir)
        self.node_id = node_id
        self.quorum_voters = quorum_voters
        self.replicas = replicas
        self.version = version
        self.host = host
        self._port_is_ours = port is None and controller_port is None
        # Two ports chosen together, so never the same one (the broker refuses two listeners on one).
        broker_port, broker_controller_port = free_ports(2, host)
        self.port = port if port is not None else broker_port
        self.controller_port = controller_port if controller_port is not None else broker_controller_port
        if self.controller_port == self.port:
            self.controller_port = next(p for p in free_ports(2, host) if p != self.port)
        self.heap = heap
        self.auto_create_topics = auto_create_topics
        self.extra_properties = dict(extra_properties or {})
        self.cluster_id = cluster_id or random_cluster_id()
        self.java = java_binary()
        #: seconds the last ``ensure_kafka_jars`` call took (Maven fetch or cache hit)
        self.jar_fetch_seconds: float | None = None
        self.format_seconds: float | None = None
        self._libs: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def data_dir(self) -> Path:
        return self.run_dir / "data"

    def _pick_new_port(self) -> None:
        self.port, self.controller_port = free_ports(2, self.host)

    def _ports(self) -> list[tuple[str, int]]:
        return [(self.host, self.port), (self.host, self.controller_port)]

    def _properties(self) -> dict[str, str]:
        voters = self.quorum_voters or f"{self.node_id}@{self.host}:{self.controller_port}"
        replicas = str(self.replicas)
        # With replicas, a write to an internal topic needs all but one of them (a single node: itself).
        min_isr = str(max(1, self.replicas - 1))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "auto.create.topics.enable": "true" if self.auto_create_topics else "false",
            # Internal topics with one replica per node (up to `replicas`), few partitions (faster boot).
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            # Tests join groups constantly: no 3 s wait for more members.
            "group.initial.rebalance.delay.ms": "0",
            # Let tests use short sessions (default minimum 6 s) so both brokers share client settings.
            "group.min.session.timeout.ms": "500",
            "log.flush.interval.messages": "9223372036854775807",
        }
        props.update(self.extra_properties)
        return props

    def _prepare(self) -> None:
        t0 = time.monotonic()
        self._libs = ensure_kafka_jars(self.version)
        self.jar_fetch_seconds = time.monotonic() - t0
        if java_major_version(self.java) < 17:
            raise BinaryNotFoundError(f"Apache Kafka {self.version} needs Java 17+; {self.java} is older")
        cfg = self.run_dir / "server.properties"
        cfg.write_text("".join(f"{k}={v}\n" for k, v in self._properties().items()))
        (self.run_dir / "log4j2.yaml").write_text(_LOG4J2_YAML)
        if not (self.data_dir / "meta.properties").exists():
            t0 = time.monotonic()
            proc = subprocess.run(
                [
                    self.java,
                    "-Xmx256m",
                    "-cp",
                    f"{self._libs}/*",
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    self.cluster_id,
                    "-c",
                    str(cfg),
                ],
                capture_output=True,
                text=True,
                timeout=120,
            )
            self.format_seconds = time.monotonic() - t0
            if proc.returncode != 0:
                raise ServiceStartError(f"kafka-storage format failed:\n{proc.stdout}\n{proc.stderr}")

    def _command(self) -> list[str]:
        assert self._libs is not None
        return [
            self.java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.run_dir / 'log4j2.yaml'}",
            "-cp",
            f"{self._libs}/*",
            "kafka.Kafka",
            str(self.run_dir / "server.properties"),
        ]

    async def _probe(self) -> bool:
        return await kafka_ready(self.bootstrap)
