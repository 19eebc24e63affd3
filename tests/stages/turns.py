"""What dispatch records when it sends a user turn, for stage tests that start from a running turn."""

from __future__ import annotations

from pipeline.state import State, TurnRecord


async def running_turn(
    state: State, conversation: str, turn: TurnRecord, turn_id: str, *, session_id: str = "s1", partition: int = 0
) -> None:
    """Map the session and record the turn as dispatch does when it sends it (`interrupt`: a turn
    sent while another runs is recorded too)."""
    await state.conversations.map_session(conversation, session_id)
    start = await state.conversations.begin_turn(
        conversation, partition, turn_id=turn_id, mode="interrupt", turn=turn, command_json="{}", trace_id=turn.trace_id
    )
    assert start.decision == "start", start
