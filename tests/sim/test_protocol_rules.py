"""The simulator follows the spec rules (P3, P4, P5, P9, P10), auth, history paging, sessions."""

from __future__ import annotations

import httpx
import pytest

from pipeline.session import (
    AuthError,
    BadRequestError,
    NotFoundError,
    ProtocolError,
    SessionClient,
    UserInterrupt,
)
from pipeline.session.models import SessionUsage
from pipeline.sim import SimServer

from .conftest import API_KEY
from .helpers import final_reply, segments_text, system_message, turn, types_of, user_message


async def test_default_reply_is_exact_im_json(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    events = await turn(ark, sid, "  hello [sim:think=0]\n world  ")
    assert final_reply(events) == '{"segments":[{"type":"text","data":{"text":"echo: hello \\n world"}}]}'


async def test_typical_turn_order_and_idle_trio(sim: SimServer, ark: SessionClient) -> None:
    """Typical turn, then P9 (thread idle, usage, idle) and P10 (usage id and processed_at)."""
    sid = await sim.create_session()
    events = await turn(ark, sid, "hi")
    kinds = types_of(events)
    assert kinds[:3] == ["session.status_running", "session.thread_status_running", "span.model_request_start"]
    assert kinds[-5:] == [
        "agent.message",
        "span.model_request_end",
        "session.thread_status_idle",
        "session.usage",
        "session.status_idle",
    ]
    usage, idle = events[-2], events[-1]
    assert isinstance(usage, SessionUsage)
    assert usage.id == f"sevt-usg-{idle.id}"
    assert usage.processed_at == idle.processed_at
    assert usage.usage.output_tokens > 0
    assert usage.usage.server_tool_use.general_search_requests == 0


async def test_client_id_echoed_and_server_ids_prefixed(sim: SimServer, ark: SessionClient) -> None:
    """P3: a client id is echoed; omitted, the server generates sevt-. P4: prefixes."""
    sid = await sim.create_session()
    raw = SessionClient(api_key=API_KEY, base_url=sim.base_url("ark"), assign_message_ids=False)
    async with raw:
        echoed = await raw.send(sid, [user_message("no id"), system_message()])
    assert echoed[0].id is not None and echoed[0].id.startswith("sevt-")
    assert echoed[1].id is not None and echoed[1].id.startswith("sevt-")
    echoed = await ark.send(sid, [user_message("with id", "my-stable-id-1"), system_message()])
    assert echoed[0].id == "my-stable-id-1"
    events = await turn(ark, sid, "threads [sim:subagent]")
    for event in events:
        if event.id != "my-stable-id-1":
            assert event.id is not None and event.id.startswith("sevt-")
        thread_id = getattr(event, "session_thread_id", None)
        if thread_id:
            assert thread_id.startswith("sthr-")


async def test_lone_system_message_rejected(sim: SimServer) -> None:
    """P5 on the server, bypassing the client-side check."""
    sid = await sim.create_session()
    async with httpx.AsyncClient(base_url=sim.base_url("anthropic"), headers={"x-api-key": API_KEY}) as http:
        lone = await http.post(
            f"/sessions/{sid}/events",
            json={"events": [{"type": "system.message", "content": [{"type": "text", "text": "x"}]}]},
        )
        assert lone.status_code == 400
        reversed_pair = await http.post(
            f"/sessions/{sid}/events",
            json={
                "events": [
                    {"type": "system.message", "content": [{"type": "text", "text": "x"}]},
                    {"type": "user.message", "content": [{"type": "text", "text": "y"}]},
                ]
            },
        )
        assert reversed_pair.status_code == 400
        with_server_fields = await http.post(
            f"/sessions/{sid}/events",
            json={"events": [{"type": "user.interrupt", "processed_at": "2026-01-01T00:00:00Z"}]},
        )
        assert with_server_fields.status_code == 400


async def test_client_refuses_lone_system_message(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    with pytest.raises(ProtocolError):
        await ark.send(sid, [system_message()])


async def test_ark_rejects_multi_event_batches_anthropic_accepts(sim: SimServer) -> None:
    sid = await sim.create_session()
    two_interrupts = {"events": [{"type": "user.interrupt"}, {"type": "user.interrupt"}]}
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        ark = await http.post(
            f"/api/v3/sessions/{sid}/events", json=two_interrupts, headers={"Authorization": f"Bearer {API_KEY}"}
        )
        assert ark.status_code == 400
        anthropic = await http.post(f"/v1/sessions/{sid}/events", json=two_interrupts, headers={"x-api-key": API_KEY})
        assert anthropic.status_code == 200
        assert [e["type"] for e in anthropic.json()["data"]] == ["user.interrupt", "user.interrupt"]


async def test_ark_client_splits_batches(sim: SimServer, ark: SessionClient) -> None:
    """The ark client sends one event per request except the user+system pair, so a mixed batch passes."""
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("a [sim:think=0.3]"), system_message(), UserInterrupt()])
    assert [e.type for e in echoed] == ["user.message", "system.message", "user.interrupt"]


async def test_auth_per_profile(sim: SimServer) -> None:
    sid = await sim.create_session()
    for profile in ("ark", "anthropic"):
        async with SessionClient(api_key="wrong", profile=profile, base_url=sim.base_url(profile)) as bad:
            with pytest.raises(AuthError):
                await bad.get_session(sid)
    async with httpx.AsyncClient(base_url=sim.root_url) as http:
        # Ark takes only the Bearer header; x-api-key is the anthropic profile's.
        crossed = await http.get(f"/api/v3/sessions/{sid}", headers={"x-api-key": API_KEY})
        assert crossed.status_code == 401
        assert (await http.get(f"/v1/sessions/{sid}", headers={"x-api-key": API_KEY})).status_code == 200


async def test_history_paging_order_and_after(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    await turn(ark, sid, "one")
    await turn(ark, sid, "two")
    everything = [e async for e in ark.list(sid)]
    paged = [e async for e in ark.list(sid, limit=3)]
    assert [e.id for e in paged] == [e.id for e in everything]
    newest_first = [e async for e in ark.list(sid, order="desc", limit=4)]
    assert [e.id for e in newest_first] == [e.id for e in reversed(everything)]
    middle = everything[5].id
    assert middle is not None
    after = [e async for e in ark.list(sid, after=middle, limit=2)]
    assert [e.id for e in after] == [e.id for e in everything[6:]]
    async with httpx.AsyncClient(base_url=sim.base_url("ark"), headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        first = (await http.get(f"/sessions/{sid}/events", params={"limit": 2})).json()
        assert len(first["data"]) == 2 and first["next_page"]
        second = (await http.get(f"/sessions/{sid}/events", params={"limit": 2, "page": first["next_page"]})).json()
        assert [e["id"] for e in second["data"]] == [e.id for e in everything[2:4]]


async def test_anthropic_profile_after_is_emulated(sim: SimServer, anthropic_client: SessionClient) -> None:
    sid = await sim.create_session()
    await turn(anthropic_client, sid, "one")
    everything = [e async for e in anthropic_client.list(sid, limit=4)]
    cursor = everything[3].id
    rest = [e async for e in anthropic_client.list(sid, after=cursor, limit=4)]
    assert [e.id for e in rest] == [e.id for e in everything[4:]]


async def test_messages_queue_while_running(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    first = await ark.send(sid, [user_message("first [sim:think=0.2]"), system_message()])
    await ark.send(sid, [user_message("second"), system_message()])
    from .helpers import collect_until

    items = await collect_until(ark, sid, after=first[-1].id, idles=2)
    replies = [segments_text(e.text) for e in items if getattr(e, "type", "") == "agent.message"]  # type: ignore[union-attr]
    assert replies == ["echo: first", "echo: second"]
    kinds = types_of(items)
    # The second message is recorded at once, but its turn starts after the first turn's idle.
    assert kinds.index("user.message") < kinds.index("session.status_idle")
    assert kinds.count("session.status_idle") == 2


async def test_session_get_create_delete(sim: SimServer, anthropic_client: SessionClient) -> None:
    created = await anthropic_client.create_session({"agent": "agent-1", "environment_id": "env-1"})
    sid = created["id"]
    assert (await anthropic_client.get_session(sid))["status"] == "idle"
    await anthropic_client.delete_session(sid)
    with pytest.raises(NotFoundError):
        await anthropic_client.get_session(sid)


async def test_terminated_session_refuses_events(sim: SimServer, ark: SessionClient) -> None:
    sid = await sim.create_session()
    echoed = await ark.send(sid, [user_message("bye [sim:terminate]"), system_message()])
    from .helpers import collect_until

    items = await collect_until(ark, sid, after=echoed[-1].id, stop_types=("session.status_terminated",))
    assert types_of(items)[-1] == "session.status_terminated"
    with pytest.raises(BadRequestError):
        await ark.send(sid, [user_message("more"), system_message()])
