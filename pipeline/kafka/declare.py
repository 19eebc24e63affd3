"""Declarative topics: :class:`TopicSpec`, ``apply_topics`` (create/update) and ``check_topics`` (drift).

Works on Apache Kafka and degrades on Tansu, which cannot alter topic configs or add partitions
(both APIs are missing from its ApiVersions): ``apply_topics`` reports those as ``degraded`` with a
message saying what to do, and ``check_topics`` keeps reporting the drift.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError, UnsupportedVersionError, for_code

from pipeline.kafka.admin import (
    TopicState,
    admin_client,
    broker_count,
    describe_topic_states,
    wait_for_topics,
)

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
#: configs whose value is a comma-separated set (order does not matter)
_LIST_CONFIGS = {"cleanup.policy"}
_TOPIC_ALREADY_EXISTS = 36
MIN_INSYNC_REPLICAS = "min.insync.replicas"


@dataclass(frozen=True)
class TopicSpec:
    """The desired state of one topic."""

    name: str
    partitions: int = 1
    replication_factor: int = 1
    config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _TOPIC_NAME.match(self.name) or self.name in (".", ".."):
            raise ValueError(f"invalid Kafka topic name {self.name!r}")
        if self.partitions < 1:
            raise ValueError(f"{self.name}: partitions must be >= 1, got {self.partitions}")
        if self.replication_factor < 1:
            raise ValueError(f"{self.name}: replication_factor must be >= 1, got {self.replication_factor}")
        bad = {k: v for k, v in self.config.items() if not isinstance(k, str) or not isinstance(v, str)}
        if bad:
            raise ValueError(f"{self.name}: config keys and values must be strings: {bad!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> TopicSpec:
        """Build from a plain mapping (e.g. a parsed topics/ file); config values are stringified."""
        config = {str(k): _config_str(v) for k, v in (data.get("config") or {}).items()}
        return cls(
            name=str(data["name"]),
            partitions=int(data.get("partitions", 1)),
            replication_factor=int(data.get("replication_factor", 1)),
            config=config,
        )


def _config_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    return str(value)


DriftKind = Literal["missing", "partitions", "replication_factor", "config"]


@dataclass(frozen=True)
class Drift:
    """One difference between a spec and the cluster."""

    topic: str
    kind: DriftKind
    expected: Any
    actual: Any
    key: str | None = None  # the config key, for kind == "config"

    def __str__(self) -> str:
        if self.kind == "missing":
            return f"{self.topic}: topic is missing"
        if self.kind == "config":
            return f"{self.topic}: config {self.key}={self.actual!r}, spec wants {self.expected!r}"
        return f"{self.topic}: {self.kind} is {self.actual}, spec wants {self.expected}"


@dataclass
class ApplyReport:
    """What ``apply_topics`` did. ``ok`` is False only for hard errors (``errors``)."""

    created: list[str] = field(default_factory=list)
    #: topic -> (old, new) partition count
    partitions_increased: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: topic -> configs set
    configs_altered: dict[str, dict[str, str]] = field(default_factory=dict)
    unchanged: list[str] = field(default_factory=list)
    #: changes the broker cannot make (e.g. Tansu) or Kafka forbids (fewer partitions, RF change)
    degraded: list[str] = field(default_factory=list)
    #: topic -> error message, for changes the broker rejected
    errors: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: brokers registered when the topics were created (after any wait for more)
    brokers: int = 0

    @property
    def ok(self) -> bool:
        return not self.errors

    def headline(self) -> str:
        """One line of counts: `3 created, 1 changed, 4 unchanged, 1 failed`."""
        changed = len(set(self.partitions_increased) | set(self.configs_altered))
        counts = [
            (len(self.created), "created"),
            (changed, "changed"),
            (len(self.unchanged), "unchanged"),
            (len(self.degraded), "not applied"),
            (len(self.errors), "failed"),
        ]
        return ", ".join(f"{n} {what}" for n, what in counts if n or what in ("created", "failed"))

    def summary(self) -> str:
        """What was done, one line per topic or change, for a terminal."""
        lines = [f"created      {t}" for t in self.created]
        lines += [f"partitions   {t}: {a} -> {b}" for t, (a, b) in self.partitions_increased.items()]
        lines += [
            f"configs      {t}: {', '.join(f'{k}={v}' for k, v in c.items())}" for t, c in self.configs_altered.items()
        ]
        lines += [f"unchanged    {t}" for t in self.unchanged]
        lines += [f"not applied  {m}" for m in self.degraded]
        lines += [f"warning      {m}" for m in self.warnings]
        lines += [f"FAILED       {t}: {m}" for t, m in self.errors.items()]
        return "\n".join(lines)


def _same_config(key: str, expected: str, actual: str | None) -> bool:
    if actual is None:
        return False
    if key in _LIST_CONFIGS:
        return {p.strip() for p in expected.split(",")} == {p.strip() for p in actual.split(",")}
    return expected == actual


def _within_replicas(config: Mapping[str, str], replicas: int) -> dict[str, str]:
    """The config with ``min.insync.replicas`` at most ``replicas``: more than a topic has replicas
    would fail every acks=all write (a spec for a 3-broker cluster applied to one dev broker)."""
    out = dict(config)
    wanted = out.get(MIN_INSYNC_REPLICAS)
    if wanted is not None and wanted.isdigit() and int(wanted) > replicas >= 1:
        out[MIN_INSYNC_REPLICAS] = str(replicas)
    return out


def _drifts(spec: TopicSpec, state: TopicState | None, brokers: int) -> list[Drift]:
    if state is None:
        return [Drift(spec.name, "missing", expected=spec.partitions, actual=None)]
    out: list[Drift] = []
    if state.partitions != spec.partitions:
        out.append(Drift(spec.name, "partitions", spec.partitions, state.partitions))
    # A spec may ask for more replicas than a dev cluster has brokers; what it can get is the cap.
    want_rf = min(spec.replication_factor, brokers) if brokers else spec.replication_factor
    if state.replication_factor < want_rf:
        out.append(Drift(spec.name, "replication_factor", want_rf, state.replication_factor))
    for key, value in sorted(_within_replicas(spec.config, min(want_rf, state.replication_factor)).items()):
        actual = state.configs.get(key)
        if not _same_config(key, value, actual):
            out.append(Drift(spec.name, "config", value, actual, key=key))
    return out


def _check_unique(specs: Iterable[TopicSpec]) -> list[TopicSpec]:
    specs = list(specs)
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"duplicate topic specs: {dupes}")
    return specs


async def check_topics(bootstrap: str, specs: Iterable[TopicSpec]) -> list[Drift]:
    """Differences between the specs and the cluster (empty list: no drift). Never changes anything."""
    specs = _check_unique(specs)
    async with admin_client(bootstrap) as admin:
        states = await describe_topic_states(admin, [s.name for s in specs])
        brokers = await broker_count(admin)
    drifts: list[Drift] = []
    for spec in specs:
        drifts.extend(_drifts(spec, states.get(spec.name), brokers))
    return drifts


async def apply_topics(
    bootstrap: str,
    specs: Iterable[TopicSpec],
    *,
    cap_replication_factor: bool = True,
    wait_timeout: float = 30.0,
    brokers_timeout: float = 0.0,
) -> ApplyReport:
    """Create missing topics, add partitions, set configs; return what was done.

    Never deletes or recreates a topic. Changes the broker cannot make are listed in
    ``report.degraded`` (not raised): Tansu has no AlterConfigs/CreatePartitions, Kafka cannot
    remove partitions or change the replication factor in place. Rejections are in
    ``report.errors``. With ``cap_replication_factor`` (a development stack of one broker) a spec
    asking for more replicas than there are brokers is created with one replica per broker (and a
    warning). Without it (a real cluster) apply first waits up to ``brokers_timeout`` seconds for
    enough brokers to register (a cluster that is still starting), then refuses, in
    ``report.errors``, each topic it cannot create with its full replication factor: a topic
    created with fewer replicas keeps them until a partition reassignment.
    """
    specs = _check_unique(specs)
    report = ApplyReport()
    async with admin_client(bootstrap) as admin:
        states = await describe_topic_states(admin, [s.name for s in specs])
        brokers = await broker_count(admin)
        missing = [s for s in specs if s.name not in states]
        if missing and not cap_replication_factor:
            needed = max(s.replication_factor for s in missing)
            brokers = await _wait_for_brokers(admin, needed, brokers, brokers_timeout)
        report.brokers = brokers
        if missing and not cap_replication_factor:
            short = [s for s in missing if s.replication_factor > brokers]
            for spec in short:
                report.errors[spec.name] = (
                    f"not created: replication factor {spec.replication_factor} needs {spec.replication_factor} "
                    f"brokers, {brokers} registered after waiting {brokers_timeout:g} s"
                )
            missing = [s for s in missing if s not in short]
        if missing:
            await _create(admin, missing, brokers, cap_replication_factor, report)
            created = {s.name: s.partitions for s in missing if s.name in report.created}
            if created:
                await wait_for_topics(bootstrap, created, timeout=wait_timeout)
        for spec in specs:
            state = states.get(spec.name)
            if state is None:
                continue
            changed = await _update(admin, bootstrap, spec, state, brokers, report)
            if not changed and spec.name not in report.errors:
                report.unchanged.append(spec.name)
    return report


async def _wait_for_brokers(admin: AIOKafkaAdminClient, needed: int, brokers: int, timeout: float) -> int:
    """The number of registered brokers once it reaches `needed`, or when `timeout` has passed."""
    deadline = time.monotonic() + timeout
    while brokers < needed and time.monotonic() < deadline:
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        brokers = await broker_count(admin)
    return brokers


async def _create(
    admin: AIOKafkaAdminClient,
    specs: list[TopicSpec],
    brokers: int,
    cap: bool,
    report: ApplyReport,
) -> None:
    new_topics = []
    for spec in specs:
        rf = spec.replication_factor
        if cap and brokers and rf > brokers:
            report.warnings.append(
                f"{spec.name}: replication_factor {rf} > {brokers} broker(s); created with {brokers}"
            )
            rf = brokers
        config = _within_replicas(spec.config, rf)
        if config != spec.config:
            report.warnings.append(
                f"{spec.name}: {MIN_INSYNC_REPLICAS} {spec.config[MIN_INSYNC_REPLICAS]} > {rf} replica(s); "
                f"created with {config[MIN_INSYNC_REPLICAS]}"
            )
        new_topics.append(NewTopic(spec.name, spec.partitions, rf, topic_configs=config))
    response = await admin.create_topics(new_topics)
    for item in response.topic_errors:
        name, code = item[0], item[1]
        message = item[2] if len(item) > 2 else None
        if code == 0 or code == _TOPIC_ALREADY_EXISTS:  # exists: created concurrently by someone else
            report.created.append(name)
        else:
            report.errors[name] = f"create failed: {for_code(code).__name__}: {message or ''}".rstrip(": ")


async def _update(
    admin: AIOKafkaAdminClient,
    bootstrap: str,
    spec: TopicSpec,
    state: TopicState,
    brokers: int,
    report: ApplyReport,
) -> bool:
    changed = False
    if spec.partitions > state.partitions:
        try:
            await admin.create_partitions({spec.name: NewPartitions(spec.partitions)})
        except (IncompatibleBrokerVersion, UnsupportedVersionError):
            report.degraded.append(
                f"{spec.name}: broker cannot add partitions (no CreatePartitions API, e.g. Tansu); "
                f"it keeps {state.partitions}, spec wants {spec.partitions}: delete and re-apply to change"
            )
        except KafkaError as exc:
            report.errors[spec.name] = f"create_partitions failed: {exc}"
        else:
            report.partitions_increased[spec.name] = (state.partitions, spec.partitions)
            await wait_for_topics(bootstrap, {spec.name: spec.partitions})
            changed = True
    elif spec.partitions < state.partitions:
        report.degraded.append(
            f"{spec.name}: has {state.partitions} partitions, spec wants {spec.partitions}; "
            "Kafka cannot remove partitions (recreate the topic, losing its data)"
        )
    want_rf = min(spec.replication_factor, brokers) if brokers else spec.replication_factor
    if state.replication_factor < want_rf:
        report.degraded.append(
            f"{spec.name}: replication factor {state.replication_factor} < {want_rf}; "
            "changing it needs a partition reassignment (not done by apply)"
        )
    # Never more in-sync replicas than the topic has: that would stop every acks=all write to it.
    spec_config = _within_replicas(spec.config, min(want_rf, state.replication_factor))
    wanted = {k: v for k, v in spec_config.items() if not _same_config(k, v, state.configs.get(k))}
    if wanted:
        # AlterConfigs (the non-incremental API, all aiokafka has) replaces the topic's whole
        # override set, so send the current overrides merged with the spec, or others get reset.
        full = {**state.overrides, **spec_config}
        try:
            responses = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, spec.name, full)])
        except (IncompatibleBrokerVersion, UnsupportedVersionError):
            report.degraded.append(
                f"{spec.name}: broker cannot alter topic configs (no AlterConfigs API, e.g. Tansu); "
                f"not applied: {wanted}: delete and re-apply the topic to change them"
            )
        except KafkaError as exc:
            report.errors[spec.name] = f"alter_configs failed: {exc}"
        else:
            failure = _alter_failure(responses)
            if failure:
                report.errors[spec.name] = f"alter_configs failed: {failure}"
            else:
                report.configs_altered[spec.name] = wanted
                changed = True
    return changed


def _alter_failure(responses: list[Any]) -> str | None:
    for response in responses:
        for res in getattr(response, "resources", []):
            code, message = res[0], res[1]
            if code:
                return f"{for_code(code).__name__}: {message or ''}"
    return None
