"""Thin, typed wrappers over aiokafka's admin client that work on Apache Kafka and on Tansu."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaConnectionError, KafkaError

from pipeline.kafka.exceptions import BrokerUnavailableError

#: DescribeConfigs config_source value for a per-topic override (Apache Kafka). Tansu reports the
#: values it stores with source 5 (DEFAULT_CONFIG), so "is this an override" cannot be told there.
CONFIG_SOURCE_DYNAMIC_TOPIC = 1


@dataclass(frozen=True)
class TopicState:
    """What the broker says about one topic."""

    name: str
    partitions: int
    replication_factor: int
    #: configs the broker reports for the topic (all of them on Kafka; only stored ones on Tansu)
    configs: dict[str, str] = field(default_factory=dict)
    #: the subset that is a per-topic override (Apache Kafka; empty on Tansu, which reports source 5)
    overrides: dict[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def admin_client(bootstrap: str, *, request_timeout_ms: int = 15000) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=request_timeout_ms)
    try:
        await admin.start()
    except (KafkaConnectionError, KafkaError, OSError) as exc:
        with contextlib.suppress(Exception):
            await admin.close()
        raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        yield admin
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def list_topics(admin: AIOKafkaAdminClient) -> set[str]:
    # Metadata with topics=None lists everything and never auto-creates (naming a topic can, on Tansu).
    return set(await admin.list_topics())


async def broker_count(admin: AIOKafkaAdminClient) -> int:
    cluster = await admin.describe_cluster()
    return len(cluster.get("brokers") or [])


async def describe_topic_states(admin: AIOKafkaAdminClient, names: Iterable[str]) -> dict[str, TopicState]:
    """State of the named topics that exist (missing ones are left out, never created)."""
    existing = await list_topics(admin)
    wanted = [n for n in names if n in existing]
    if not wanted:
        return {}
    metas = await admin.describe_topics(wanted)
    configs = await describe_topic_configs(admin, wanted)
    out: dict[str, TopicState] = {}
    for meta in metas:
        if meta.get("error_code"):
            continue
        parts = meta.get("partitions") or []
        rf = max((len(p.get("replicas") or []) for p in parts), default=0)
        all_cfg, overrides = configs.get(meta["topic"], ({}, {}))
        out[meta["topic"]] = TopicState(meta["topic"], len(parts), rf, all_cfg, overrides)
    return out


async def describe_topic_configs(
    admin: AIOKafkaAdminClient, names: list[str]
) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """``{topic: (all reported configs, per-topic overrides)}``."""
    if not names:
        return {}
    responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
    out: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for response in responses:
        for res in response.resources:
            error_code, _msg, _rtype, rname, entries = res[:5]
            if error_code:
                continue
            all_cfg: dict[str, str] = {}
            overrides: dict[str, str] = {}
            for entry in entries:
                key, value, _read_only, source = entry[0], entry[1], entry[2], entry[3]
                if value is None:
                    continue
                all_cfg[key] = value
                if source == CONFIG_SOURCE_DYNAMIC_TOPIC:
                    overrides[key] = value
            out[rname] = (all_cfg, overrides)
    return out


async def wait_for_topics(admin: AIOKafkaAdminClient, partitions: dict[str, int], *, timeout: float = 30.0) -> None:
    """Wait until each topic is in metadata with at least N partitions, all with a leader.

    Apache Kafka creates topics asynchronously (CreateTopics returns before every partition has a
    leader); producing right away would log "unknown topic" and retry.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        existing = await list_topics(admin)
        present = [n for n in partitions if n in existing]
        ok = len(present) == len(partitions)
        if ok:
            for meta in await admin.describe_topics(present):
                parts = meta.get("partitions") or []
                if meta.get("error_code") or len(parts) < partitions[meta["topic"]]:
                    ok = False
                elif any(p.get("leader", -1) < 0 for p in parts):
                    ok = False
        if ok:
            return
        if loop.time() > deadline:
            raise TimeoutError(f"topics not ready after {timeout}s: {sorted(partitions)}")
        await asyncio.sleep(0.05)
