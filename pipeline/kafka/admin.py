"""Thin, typed wrappers over aiokafka's admin client that work on Apache Kafka and on Tansu."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.protocol.metadata import MetadataRequest

from pipeline.kafka.exceptions import BrokerUnavailableError
from pipeline.redact import redact_url

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
        raise BrokerUnavailableError(f"cannot reach Kafka at {redact_url(bootstrap)}: {redact_url(str(exc))}") from exc
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


@contextlib.asynccontextmanager
async def _node_client(bootstrap: str, timeout: float) -> AsyncIterator[AIOKafkaClient]:
    """A client that can address each broker by node id (the admin client cannot)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        yield client
    finally:
        with contextlib.suppress(Exception):
            await client.close()


async def _ask_each_node(client: AIOKafkaClient, topics: list[str], timeout: float) -> dict[int, dict[str, Any]]:
    request = MetadataRequest(topics, allow_auto_topic_creation=False)
    answers: dict[int, dict[str, Any]] = {}
    for broker in client.cluster.brokers():
        response = await asyncio.wait_for(client.send(broker.nodeId, request), timeout)
        answers[broker.nodeId] = response.to_object()
    return answers


async def metadata_of_each_node(
    bootstrap: str, topics: list[str], *, timeout: float = 5.0
) -> dict[int, dict[str, Any]]:
    """Node id -> that node's own metadata answer for ``topics`` (never auto-created), for every
    node the bootstrap node knows of.

    Each broker keeps its own copy of the cluster's metadata and learns of a new broker or topic a
    little after the controller does. A plain metadata call asks one node at random, so a topic
    one node lists may still be unknown to the next client's node; this asks each one.
    """
    async with _node_client(bootstrap, timeout) as client:
        return await _ask_each_node(client, topics, timeout)


def _lists_topics(metadata: dict[str, Any], partitions: dict[str, int]) -> bool:
    """Whether one node's metadata has each topic with at least N partitions, each with a leader."""
    listed = {t["topic"]: t for t in metadata.get("topics") or [] if not t.get("error_code")}
    for name, wanted in partitions.items():
        parts = (listed.get(name) or {}).get("partitions") or []
        if len(parts) < wanted or any(p.get("leader", -1) < 0 for p in parts):
            return False
    return True


async def wait_for_topics(bootstrap: str, partitions: dict[str, int], *, timeout: float = 30.0) -> None:
    """Wait until every broker's metadata lists each topic with at least N partitions, all with a
    leader.

    Apache Kafka creates topics asynchronously (CreateTopics returns before every partition has a
    leader, and before every broker has heard of the topic); producing, or checking the topics,
    right away would find it unknown on some node.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    names = sorted(partitions)
    async with _node_client(bootstrap, min(timeout, 5.0)) as client:  # one connection per node, polled
        while True:
            with contextlib.suppress(KafkaError, OSError, TimeoutError):
                answers = await _ask_each_node(client, names, min(timeout, 5.0))
                if answers and all(_lists_topics(m, partitions) for m in answers.values()):
                    return
            if loop.time() > deadline:
                raise TimeoutError(f"topics not ready on every broker after {timeout}s: {names}")
            await asyncio.sleep(0.05)
