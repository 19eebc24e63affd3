"""Broker refusals a worker meets at start, told as one line naming the setting that avoids them.

An idempotent producer (SWITCHBOARD_KAFKA_IDEMPOTENCE, on by default) starts with an
InitProducerId request. A broker without idempotent producers (Tansu) answers it with an unknown
error, an old one with "unsupported version", one with ACLs and no IdempotentWrite grant with a
cluster authorization failure; aiokafka raises each as a bare `UnknownError()` (or its own name),
which says nothing about the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    KafkaConnectionError,
    UnknownError,
    UnsupportedVersionError,
)

from pipeline.redact import redact_url

IDEMPOTENCE_VARIABLE = "SWITCHBOARD_KAFKA_IDEMPOTENCE"


def idempotence_refusal(exc: BaseException, bootstrap: str) -> str | None:
    """The line for a refused InitProducerId, or None when `exc` is not one of those refusals."""
    where = f"the broker at {redact_url(bootstrap)}"
    consequence = "a write the producer retries after a broker failure may then be stored twice"
    if isinstance(exc, ClusterAuthorizationFailedError):
        return (
            f"{where} refused an idempotent producer (InitProducerId: not authorized): grant the worker's "
            f"user IdempotentWrite on the cluster, or set {IDEMPOTENCE_VARIABLE}=false ({consequence})"
        )
    if isinstance(exc, UnknownError | UnsupportedVersionError):
        return (
            f"{where} does not support idempotent producers (InitProducerId: {type(exc).__name__}): "
            f"set {IDEMPOTENCE_VARIABLE}=false ({consequence}; the embedded Tansu broker is such a broker)"
        )
    return None


async def idempotence_problem(bootstrap: str, timeout: float = 15.0) -> str | None:
    """Start an idempotent producer once (one InitProducerId, nothing produced): None when the
    broker grants it or cannot be asked (unreachable: the reachability check says so), else the
    refusal's line."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    # aiokafka logs the refusal as an error of its own ("Unexpected error during
    # InitProducerIdRequest"): the line returned here says it, once.
    aiokafka_log = logging.getLogger("aiokafka")
    level = aiokafka_log.level
    aiokafka_log.setLevel(logging.CRITICAL)
    try:
        await asyncio.wait_for(producer.start(), timeout)
    except (KafkaConnectionError, TimeoutError, OSError):
        return None
    except Exception as exc:
        refusal = idempotence_refusal(exc, bootstrap)
        if refusal is None:
            raise
        return refusal
    finally:
        with contextlib.suppress(Exception):
            await producer.stop()
        aiokafka_log.setLevel(level)
    return None
