"""Shared fixtures: real brokers and Redis started on free ports for the test session.

Brokers
    ``kafka_bootstrap`` (session, str) is parametrised over the brokers named in
    ``SWITCHBOARD_TEST_BROKERS`` (comma separated; default ``tansu``; add ``kafka`` for Apache
    Kafka, which is fetched with Maven on first use and takes a few seconds to boot). A test that
    takes ``kafka_bootstrap`` (or ``kafka_broker``, ``topic_factory``) runs once per broker, with
    ids ``[tansu]`` / ``[kafka]``. ``tansu_broker`` / ``apache_kafka`` give one broker explicitly
    (``apache_kafka`` skips unless enabled).

Redis
    ``redis_server`` (session) is a real redis-server; ``redis_url`` (function) is a URL to a DB
    number no other test in the session is using (flushed before use); ``redis_prefix`` a unique
    key prefix; ``redis_client`` a ``redis.asyncio.Redis`` on ``redis_url``.

Factories for fault tests that stop/kill services: ``redis_server_factory`` and
``tansu_broker_factory`` start private instances that are stopped when the test ends.

Tiers
    ``make test`` (the fast tier) runs every test not marked ``full``; ``make test-all`` runs them
    all on both brokers. ``FULL_TIER`` below says which modules only the full tier runs, and why.
    With ``SWITCHBOARD_TEST_TIER=all`` a skip is a failure unless its reason is in
    ``EXPECTED_SKIPS``: the full tier must not lose coverage silently.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from pipeline.embedded import ApacheKafka, RedisCluster, RedisServer, TansuBroker
from pipeline.kafka.testing import TopicFactory
from pipeline.kafka.testing import unique_name as _unique_name
from pipeline.state import State

BROKERS_ENV = "SWITCHBOARD_TEST_BROKERS"
TIER_ENV = "SWITCHBOARD_TEST_TIER"
KNOWN_BROKERS = ("tansu", "kafka")
#: DBs per session Redis: each test gets its own, so tests never see each other's keys
REDIS_DATABASES = 512

KafkaBroker = TansuBroker | ApacheKafka


def enabled_brokers() -> list[str]:
    raw = os.environ.get(BROKERS_ENV, "tansu")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in KNOWN_BROKERS]
    if unknown:
        raise pytest.UsageError(f"{BROKERS_ENV}: unknown broker(s) {unknown}; known: {KNOWN_BROKERS}")
    return names or ["tansu"]


# -- tiers ---------------------------------------------------------------------------------------------
#: Test modules (or folders) only the full tier runs, each with the reason. Everything else, on the
#: embedded broker and Redis, is in `make test` too.
FULL_TIER: dict[str, str] = {
    "tests/faults/": "kills workers, brokers and Redis under a minute of load each; the 3-broker Kafka cluster",
    "tests/state/test_sentinel.py": "a five-process Sentinel topology per test, failovers take seconds",
    "tests/state/test_cluster.py": "a six-node Redis Cluster with failovers",
    "tests/integration/test_redis_cluster.py": "the pipeline on a six-node Redis Cluster",
    "tests/integration/test_redis_failover.py": "a Redis primary killed under the pipeline",
    "tests/integration/test_redis_outage.py": "Redis stopped and restarted under the pipeline",
    "tests/integration/test_worker_crash.py": "workers SIGKILLed mid-turn",
    "tests/integration/test_usage_budgets.py::test_replayed_usage_after_a_sigkill_counts_once": (
        "a worker SIGKILLed mid-turn"
    ),
    "tests/packaging/": "builds the wheel and installs it into a fresh virtualenv",
    "tests/embedded/test_apache_kafka.py": "boots Apache Kafka (a JVM)",
    "tests/cli/test_up_lifecycle.py::test_hang_up_stops_every_part_on_apache_kafka": "`up` on Apache Kafka (a JVM)",
    "tests/bench/test_chaos_onebot.py": "the bench's chaos run, a minute of load",
    "tests/bench/test_bench_smoke.py": "runs `switchboard bench --quick`: a stack and the bare turn under load",
    "tests/bench/test_capacity.py::test_a_short_capacity_run": "a capacity run: a stack per CPU set under load",
    "tests/bench/test_soak.py::test_a_short_soak_run": "`switchboard bench --soak`: a stack under a minute of load",
    # The holders' takeovers: the fast tier keeps each transport's end-to-end tests (held once,
    # answered once, replies from any worker); these SIGKILL the holder under traffic.
    "tests/integration/test_long_connections.py::test_forward_holder_sigkilled": "SIGKILLs the OneBot holder",
    "tests/integration/test_long_connections.py::test_reverse_holder_sigkilled": "SIGKILLs the OneBot holder",
    "tests/integration/test_dialed_connections.py::test_holder_sigkilled": "SIGKILLs each dialed connection's holder",
    "tests/integration/test_telegram_polling.py::test_holder_sigkilled": "SIGKILLs the getUpdates holder",
    "tests/integration/test_discord_e2e.py::test_the_holder_sigkilled": "SIGKILLs the Gateway holder",
    "tests/integration/test_satori_e2e.py::test_the_holder_sigkilled": "SIGKILLs the Satori event socket's holder",
}

#: Tests the full tier runs after the others, one at a time (no pytest-xdist): they SIGKILL workers,
#: brokers and Redis under a minute of load and count every reply, or time a Sentinel failover
#: against a client's re-check; on a machine shared with other tests the faults they inject become
#: timing they do not control.
ALONE: tuple[str, ...] = ("tests/faults/", "tests/state/test_sentinel.py")

#: Skip reasons the full tier accepts (a substring of the reason); any other skip fails it.
EXPECTED_SKIPS: tuple[str, ...] = ("Tansu-only characterisation",)


#: States a test's plain helper functions connected (`connect_state`), closed after the test.
_connected_states: list[State] = []


def connect_state(url: str, prefix: str, **options: Any) -> State:
    """`State.connect` for a helper function that has no fixture to close it: closed after the test
    by `close_connected_states` (the module uses it). An unclosed client's watchdog task, collected
    later, is logged as an error in whichever test runs then."""
    state = State.connect(url, prefix, **options)
    _connected_states.append(state)
    return state


@pytest.fixture
async def close_connected_states() -> AsyncIterator[None]:
    yield
    while _connected_states:
        await _connected_states.pop().redis.aclose()


def full_tier() -> bool:
    return os.environ.get(TIER_ENV, "fast").strip().lower() == "all"


#: Fixtures that start a real broker or Redis: a test using one is an integration test.
_SERVICE_FIXTURES = frozenset(
    {"kafka_broker", "tansu_broker", "apache_kafka", "redis_server", "redis_cluster", "stack"}
    | {"redis_server_factory", "tansu_broker_factory"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.nodeid.startswith(prefix) for prefix in FULL_TIER):
            item.add_marker(pytest.mark.full)
        if any(item.nodeid.startswith(prefix) for prefix in ALONE):
            item.add_marker(pytest.mark.alone)
        if _SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if full_tier() and report.skipped and not hasattr(report, "wasxfail"):
        reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
        if not any(expected in reason for expected in EXPECTED_SKIPS):
            report.outcome = "failed"
            report.longrepr = f"unexpected skip in the full tier ({TIER_ENV}=all): {reason}"
    return report


# -- brokers ------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[TansuBroker]:
    """The session's Tansu broker (always available)."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafka]:
    """The session's Apache Kafka broker; skips unless SWITCHBOARD_TEST_BROKERS includes ``kafka``."""
    if "kafka" not in enabled_brokers():
        pytest.skip(f"Apache Kafka not enabled (set {BROKERS_ENV}=tansu,kafka)")
    with ApacheKafka() as broker:
        yield broker


@pytest.fixture(scope="session", params=enabled_brokers())
def kafka_broker(request: pytest.FixtureRequest) -> KafkaBroker:
    """The broker object for this parametrisation (``.bootstrap``, ``.kind``, ``.restart()``...)."""
    name = "tansu_broker" if request.param == "tansu" else "apache_kafka"
    broker: KafkaBroker = request.getfixturevalue(name)
    return broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``"127.0.0.1:PORT"`` of the broker under test (one test run per enabled broker)."""
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_fetch_max_wait_ms(kafka_broker: KafkaBroker) -> int:
    """Consumer fetch wait suited to the broker (20 ms on Tansu, which never answers a fetch early)."""
    return kafka_broker.recommended_fetch_max_wait_ms


@pytest.fixture(scope="session")
def kafka_consumer_config(kafka_broker: KafkaBroker) -> dict[str, int]:
    """aiokafka consumer kwargs for the broker: fetch wait plus a short session timeout (Tansu
    answers a group's first JoinGroup only after session_timeout_ms / 2)."""
    return dict(kafka_broker.recommended_consumer_config)


# -- names and topics ---------------------------------------------------------------------------------
@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``unique_name(prefix="t") -> str``: unique in the session, includes the test's name."""
    scope = request.node.name

    def make(prefix: str = "t") -> str:
        return _unique_name(prefix, scope)

    return make


@pytest.fixture
def topic_factory(kafka_bootstrap: str, request: pytest.FixtureRequest) -> TopicFactory:
    """``await topic_factory(partitions=N, config=...) -> name``; ``await topic_factory.many(k, N)``."""
    return TopicFactory(kafka_bootstrap, scope=request.node.name)


# -- redis --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server for the session (no persistence)."""
    with RedisServer(databases=REDIS_DATABASES) as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A real Redis Cluster for the session: 3 primaries, 3 replicas (tests share it through
    their unique key prefixes). Fault tests that kill a node start their own."""
    with RedisCluster() as cluster:
        yield cluster


_redis_db_counter = itertools.count(1)  # DB 0 is left for code that ignores the URL's DB


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """``redis://127.0.0.1:PORT/N`` with a DB no other test of the session uses (flushed first)."""
    db = 1 + (next(_redis_db_counter) - 1) % (redis_server.databases - 1)
    client = redis.Redis(host=redis_server.host, port=redis_server.port, db=db)
    try:
        client.flushdb()
    finally:
        client.close()
    return redis_server.url_for_db(db)


@pytest.fixture
def redis_prefix(unique_name: Callable[..., str]) -> str:
    """A unique key prefix ending in ``:``, for code that shares one DB."""
    return unique_name("sb") + ":"


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


# -- private instances for fault tests ----------------------------------------------------------------
@pytest.fixture
async def redis_server_factory() -> AsyncIterator[Callable[..., Awaitable[RedisServer]]]:
    """``await redis_server_factory(aof=True)`` -> a started private RedisServer (stopped at the end)."""
    started: list[RedisServer] = []

    async def make(**kwargs: Any) -> RedisServer:
        server = RedisServer(**kwargs)
        started.append(server)
        return await server.start()

    yield make
    for server in reversed(started):
        await server.stop()
        server.cleanup()


@pytest.fixture
async def tansu_broker_factory() -> AsyncIterator[Callable[..., Awaitable[TansuBroker]]]:
    """``await tansu_broker_factory()`` -> a started private TansuBroker (stopped at the end)."""
    started: list[TansuBroker] = []

    async def make(**kwargs: Any) -> TansuBroker:
        broker = TansuBroker(**kwargs)
        started.append(broker)
        return await broker.start()

    yield make
    for broker in reversed(started):
        await broker.stop()
        broker.cleanup()
