"""Accumulates ``event_start`` / ``event_delta`` preview frames into text previews (P6).

Previews are keyed by the id of the event they preview; the final complete event with that id
replaces (drops) the preview. Memory is bounded: a model request that ends without its final event
is closed by ``span.model_request_end``, and at most ``max_open`` previews are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pipeline.session.models import EventDelta, EventStart


@dataclass(slots=True)
class Preview:
    """Text so far of an event still being produced. ``parts[i]`` is the text at content index i."""

    event_id: str
    event_type: str = "agent.message"
    parts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.parts)


class PreviewAccumulator:
    def __init__(self, max_open: int = 8) -> None:
        self._open: OrderedDict[str, Preview] = OrderedDict()
        self._max_open = max_open

    def __len__(self) -> int:
        return len(self._open)

    def apply(self, frame: EventStart | EventDelta) -> Preview:
        if isinstance(frame, EventStart):
            return self._get(frame.event.id, frame.event.type)
        preview = self._get(frame.event_id, "agent.message")  # a delta whose start we missed
        index = frame.delta.index or 0
        while len(preview.parts) <= index:
            preview.parts.append("")
        preview.parts[index] += frame.delta.text
        return preview

    def finish(self, event_id: str | None) -> Preview | None:
        """The complete event arrived: it replaces its preview."""
        return self._open.pop(event_id, None) if event_id else None

    def clear(self) -> None:
        self._open.clear()

    def _get(self, event_id: str, event_type: str) -> Preview:
        preview = self._open.get(event_id)
        if preview is None:
            preview = Preview(event_id=event_id, event_type=event_type)
            self._open[event_id] = preview
            while len(self._open) > self._max_open:
                self._open.popitem(last=False)
        return preview
