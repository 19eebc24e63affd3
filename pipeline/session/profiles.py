"""The two transport profiles of one protocol (docs/session-protocol.md, "Transport"): base path,
auth headers, preview query encoding, send batching and how history is resumed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeline.session.exceptions import ProtocolError

ProfileName = Literal["ark", "anthropic"]

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_BETA = "managed-agents-2026-04-01"


@dataclass(frozen=True, slots=True)
class Profile:
    name: ProfileName
    default_base_url: str
    base_path: str  # path prefix the sim serves this profile under
    one_event_per_request: bool  # Ark: one event per POST, except user.message + system.message (P5)
    bracket_deltas: bool  # event_deltas[]=… (anthropic) vs repeated event_deltas=… (ark)
    native_after: bool  # history accepts ?after=<event id>; otherwise the client skips up to it

    def auth_headers(self, api_key: str) -> dict[str, str]:
        if self.name == "anthropic":
            return {
                "x-api-key": api_key,
                "anthropic-version": ANTHROPIC_VERSION,
                "anthropic-beta": ANTHROPIC_BETA,
            }
        return {"Authorization": f"Bearer {api_key}"}

    def delta_params(self, delta_types: Sequence[str]) -> list[tuple[str, str | int | float | bool | None]]:
        key = "event_deltas[]" if self.bracket_deltas else "event_deltas"
        return [(key, t) for t in delta_types]

    def split_batch(self, events: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
        """Cut a batch of wire events into the requests this profile allows. Validates P5 on the way."""
        check_system_message_placement(events)
        if not self.one_event_per_request:
            return [list(events)] if events else []
        requests: list[list[dict[str, Any]]] = []
        for event in events:
            if event.get("type") == "system.message":
                requests[-1].append(event)  # placement checked above: previous request is its user.message
            else:
                requests.append([event])
        return requests


def check_system_message_placement(events: Sequence[dict[str, Any]]) -> None:
    """P5: every system.message directly follows a user.message in the same array."""
    for position, event in enumerate(events):
        if event.get("type") != "system.message":
            continue
        if position == 0 or events[position - 1].get("type") != "user.message":
            raise ProtocolError("system.message must directly follow a user.message in the same batch (P5)")


ARK = Profile(
    name="ark",
    default_base_url="https://ark.cn-beijing.volces.com/api/v3",
    base_path="/api/v3",
    one_event_per_request=True,
    bracket_deltas=False,
    native_after=True,
)
ANTHROPIC = Profile(
    name="anthropic",
    default_base_url="https://api.anthropic.com/v1",
    base_path="/v1",
    one_event_per_request=False,
    bracket_deltas=True,
    native_after=False,
)
PROFILES: dict[str, Profile] = {"ark": ARK, "anthropic": ANTHROPIC}


def get_profile(name: str | Profile) -> Profile:
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown session profile {name!r}; expected one of {sorted(PROFILES)}") from None
