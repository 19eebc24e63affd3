"""What dispatch records when it sends a user turn, for stage tests that start from a running turn;
a recorder of what a stage produces, at the producer seam; the Redis round trips counted."""

from __future__ import annotations

from prometheus_client import REGISTRY

from pipeline.records import OutboundMessage
from pipeline.state import State, TurnRecord


def round_trips() -> float:
    """Redis round trips the process has sent so far (the client's counter)."""
    return REGISTRY.get_sample_value("switchboard_redis_round_trips_total") or 0.0


class Recorder:
    """Stands for the producer (`Outputs`' send): keeps every record in order."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes]] = []

    async def __call__(self, topic: str, key: str | None, value: bytes) -> None:
        self.records.append((topic, value))

    def replies(self) -> list[OutboundMessage]:
        """Every outbound message produced (replies, notices, …), in order."""
        return [OutboundMessage.model_validate_json(v) for t, v in self.records if t.startswith("im.outbound.")]


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
