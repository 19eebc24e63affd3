"""Redis Cluster: the `redis+cluster://` URL, hash-tagged keys, the client's routing and splitting,
and a primary SIGKILLed with its replica promoted, against real `redis-server --cluster-enabled yes`
nodes (`pipeline.embedded.RedisCluster`). The stores' own tests run on the cluster too
(tests/state/conftest.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from redis.asyncio import RedisCluster as RedisPyCluster

from pipeline import preflight
from pipeline.embedded import RedisCluster, free_port
from pipeline.runtime import deployment_secrets
from pipeline.settings import Settings
from pipeline.state import InflightStream, Keys, RedisClient, State, TurnRecord, redis_py_client
from pipeline.state._cluster import slot_of
from pipeline.state.client import Script
from pipeline.state.exceptions import UNAVAILABLE
from pipeline.state.redis_url import ClusterTarget, Endpoint, parse_redis_url
from pipeline.worker.handling import Handling

T = TypeVar("T")
PASSWORD = "c1uster-Test-Passw0rd"
TURN = TurnRecord(trace_id="t", platform="console", bot_id="b", chat_id="c", chat_type="group", starter_id="u1")


def test_cluster_url_forms() -> None:
    target = parse_redis_url("redis+cluster://:p%40ss@n1:7000,n2,10.0.0.3:7002")
    assert target == ClusterTarget(nodes=(("n1", 7000), ("n2", 6379), ("10.0.0.3", 7002)), password="p@ss")
    assert target.node("10.0.0.9", 7005) == Endpoint("10.0.0.9", 7005, 0, None, "p@ss")
    assert parse_redis_url("rediss+cluster://u:pw@n1") == ClusterTarget((("n1", 6379),), "u", "pw", tls=True)
    for bad, problem in [
        ("redis+cluster://:pw@", "without nodes"),
        ("redis+cluster://:pw@n1:7000/1", "no database number"),
        ("redis+cluster://:pw@n1:7000?x=1", "no database number"),
        ("redis+cluster://:pw@n1:port", "bad node address"),
    ]:
        with pytest.raises(ValueError, match=problem) as info:
            parse_redis_url(bad)
        assert "pw" not in str(info.value)
    with pytest.raises(ValueError, match="names a cluster"):
        Endpoint.from_url("redis+cluster://n1")


def test_the_password_of_a_cluster_url_is_a_deployment_secret() -> None:
    settings = Settings(redis_url=f"redis+cluster://:{PASSWORD}@n1:7000,n2:7001")
    assert PASSWORD in [secret.value for secret in deployment_secrets(settings)]


def test_preflight_names_the_nodes_without_the_password() -> None:
    dead = [free_port(), free_port()]
    url = f"redis+cluster://:{PASSWORD}@127.0.0.1:{dead[0]},127.0.0.1:{dead[1]}"
    problem = preflight.redis_problem(url, "SWITCHBOARD_REDIS_URL", timeout=0.5)
    assert problem is not None
    assert problem.startswith(f"cannot reach Redis at cluster via 127.0.0.1:{dead[0]},127.0.0.1:{dead[1]}"), problem
    assert PASSWORD not in problem


@pytest.mark.parametrize("conversation", ["console:b:c", "slack:T1:C%3A9", "}x{", "a}b{c", "%7D"])
def test_every_key_a_conversations_scripts_touch_shares_its_slot(conversation: str) -> None:
    keys = Keys("sb:", cluster=True)
    touched = [
        keys.conversation(conversation),
        keys.held(conversation),
        keys.turns(conversation),
        keys.turn("turn-1", conversation),
        keys.turn_prefix(conversation) + "turn-1",
        keys.window(conversation),
        keys.inflight(4, conversation),
        keys.session_of(conversation),
        keys.absent(conversation),
        *(keys.marker(kind, "id-1", conversation) for kind in ("in", "sent", "turnbind", "turnend")),
    ]
    assert len(set(touched)) == len(touched) - 1  # all distinct but the prefix-built turn key
    assert {slot_of(key) for key in touched} == {slot_of(keys.conversation(conversation))}
    assert keys.turn_prefix(conversation) + "turn-1" == keys.turn("turn-1", conversation)
    bot = [keys.lease("onebot", "qq1", "api"), keys.lease_token("onebot", "qq1"), keys.offset("onebot", "qq1")]
    bot += [keys.action_done("onebot", "qq1", "req-1"), keys.actions("onebot", "qq1"), keys.resume("onebot", "qq1")]
    assert len({slot_of(key) for key in bot}) == 1


def test_a_conversations_with_braces_do_not_share_a_slot_by_accident() -> None:
    keys = Keys("sb:", cluster=True)
    # Percent-encoded scopes: `a}` and `a%7D` stay two conversations, each with a non-empty tag.
    assert keys.conversation("a}") != keys.conversation("a%7D")
    assert keys.conversation("}") == "sb:conv:{%7D}"
    with pytest.raises(ValueError, match="prefix"):
        Keys("sb{x}:", cluster=True)


def test_on_one_server_the_keys_are_the_ones_they_always_were() -> None:
    """No hash tags without a cluster: an upgrade finds every marker and mapping where it was."""
    keys = Keys("sb:")
    assert keys.conversation("console:b:c") == "sb:conv:console:b:c"
    assert keys.turn("t1", "console:b:c") == "sb:turn:t1"
    assert keys.turn_prefix("console:b:c") == "sb:turn:"
    assert keys.marker("sent", "t1", "console:b:c") == "sb:dedup:sent:t1"
    assert keys.marker("out", "out-1", "console:b") == "sb:dedup:out:out-1"
    assert keys.inflight(3, "console:b:c") == "sb:inflight:3"
    assert keys.rate_window("console:b:c", "console:b") == "sb:rate:console:b:c"
    assert keys.lease("onebot", "qq1", "api") == "sb:lease:onebot:qq1:api"
    assert keys.action_done("onebot", "qq1", "r1") == "sb:action-done:r1"
    assert keys.absent("console:b:c") == ""


async def test_the_client_routes_each_call_and_splits_what_spans_slots(
    redis_cluster: RedisCluster, redis_prefix: str
) -> None:
    client = RedisClient(redis_cluster.url)
    try:
        keys = [f"{redis_prefix}k{i}" for i in range(12)]
        await client.execute("SET", keys[0], "v0")
        assert client._cluster is not None and client._cluster._slots is not None  # noqa: SLF001
        primaries = {client._cluster._slots[slot_of(k)] for k in keys}  # noqa: SLF001
        assert len(primaries) == 3  # the keys are spread over every primary
        replies = await client.pipeline([("SET", k, f"v{i}") for i, k in enumerate(keys)])
        assert replies == ["OK"] * len(keys)
        assert await client.execute("MGET", *keys, f"{redis_prefix}none") == [f"v{i}" for i in range(12)] + [None]
        assert await client.transaction([("INCR", keys[0] + "n"), ("INCR", keys[1] + "n"), ("GET", keys[2])]) == [
            1,
            1,
            "v2",
        ]
        assert await client.execute("DEL", *keys) == len(keys)
        assert await client.execute("EXISTS", keys[0]) == 0
        tagged = [f"{redis_prefix}{{tag}}a", f"{redis_prefix}{{tag}}b"]
        script = Script("redis.call('SET', KEYS[1], ARGV[1]); return redis.call('INCR', KEYS[2])")
        assert await client.run_script(script, tagged, ["x"]) == 1
        with pytest.raises(ValueError, match="hash tag"):
            await client.run_script(script, keys[:2], ["x"])
        assert client.slot_of(tagged[0]) == client.slot_of(tagged[1])
    finally:
        await client.aclose()


async def test_inflight_streams_are_indexed_per_partition_and_pruned(
    redis_cluster: RedisCluster, redis_prefix: str
) -> None:
    state = State.connect(redis_cluster.url, redis_prefix, mapping_ttl=600, dedup_ttl=300)
    try:
        assert state.keys.cluster
        await state.streams.add_inflight(1, InflightStream("s1", "console:b:c1"))
        await state.streams.add_inflight(1, InflightStream("s2", "console:b:c2"))
        await state.streams.remove_inflight(1, "s1", "console:b:c1")
        assert [s.session_id for s in await state.streams.inflight(1)] == ["s2"]
        index = state.keys.inflight_index(1)
        assert await state.redis.execute("SMEMBERS", index) == ["console:b:c2"]  # c1's entry pruned
        assert 0 < await state.redis.execute("TTL", index) <= 600
    finally:
        await state.redis.aclose()


async def _until_it_succeeds(call: Callable[[], Awaitable[T]]) -> tuple[T, float, int]:
    """`call()` through the stages' own retry loop (pauses shortened to 50 ms)."""
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)
        await asyncio.sleep(0.05)

    t0 = time.monotonic()
    result = await asyncio.wait_for(Handling("cluster-test", sleep=pause).retrying(call), timeout=60)
    return result, time.monotonic() - t0, len(pauses)


@pytest.fixture
async def own_cluster() -> AsyncIterator[RedisCluster]:
    """A private cluster (a node is killed), with a password."""
    async with RedisCluster(password=PASSWORD, node_timeout_ms=1000) as cluster:
        yield cluster


async def test_primary_killed_the_stores_follow_the_promoted_replica(own_cluster: RedisCluster) -> None:
    state = State.connect(own_cluster.url, "sb:", mapping_ttl=600, dedup_ttl=300, replica_wait_ms=2000)
    redis_py = redis_py_client(own_cluster.url, decode_responses=True, socket_timeout=5)
    assert isinstance(redis_py, RedisPyCluster)
    try:
        victim = (await own_cluster.primaries())[0]
        assert state.redis._cluster is not None  # noqa: SLF001
        await state.redis.execute("PING")
        await state.redis._cluster._ready()  # noqa: SLF001
        # A conversation whose slot the victim serves.
        conversation = next(
            f"console:b:c{i}"
            for i in range(10_000)
            if state.redis._cluster._address(slot_of(state.keys.conversation(f"console:b:c{i}"))) == victim.address  # noqa: SLF001
        )
        await state.conversations.map_session(conversation, "s1")
        first = await state.conversations.begin_turn(
            conversation, 0, turn_id="t1", mode="merge", turn=TURN, command_json="{}", trace_id="t1"
        )
        assert first.decision == "start"
        await state.redis.replicated()  # WAIT: on the victim's replica before the kill
        py_key = state.keys.conversation(conversation) + ":py"  # the same slot
        await redis_py.set(py_key, "before")

        followers = await own_cluster.kill(victim)  # SIGKILL
        assert followers
        with pytest.raises(UNAVAILABLE):  # what the stages retry on, never a dead letter
            await state.conversations.conversation(conversation)

        async def second_turn() -> str:
            start = await state.conversations.begin_turn(
                conversation, 0, turn_id="t2", mode="merge", turn=TURN, command_json="{}", trace_id="t2"
            )
            return start.decision

        (decision, seconds, retries), (_, py_seconds, _) = await asyncio.gather(
            _until_it_succeeds(second_turn), _until_it_succeeds(lambda: redis_py.set(py_key + "-after", "1"))
        )
        promoted = await own_cluster.wait_promoted(victim)
        print(
            f"\ncluster failover (SIGKILL, node timeout 1000 ms): the stores writing again {seconds:.2f} s after"
            f" the kill ({retries} retries), redis-py's RedisCluster {py_seconds:.2f} s"
        )
        assert promoted in followers
        assert decision == "held"  # t1 still runs: the state written before the kill survived
        assert state.redis._cluster._address(slot_of(state.keys.conversation(conversation))) == promoted.address  # noqa: SLF001
        again = await state.conversations.begin_turn(
            conversation, 0, turn_id="t1", mode="merge", turn=TURN, command_json="{}", trace_id="t1"
        )
        assert again.decision in ("done", "resume")  # a replay of t1 is recognised, not sent twice
        assert await redis_py.get(py_key) == "before"
    finally:
        await state.redis.aclose()
        await redis_py.aclose()
