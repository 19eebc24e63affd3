"""Parses the ``[sim:NAME]`` / ``[sim:NAME=VALUE]`` directives that steer the scripted agent.

Value rule: for every directive but ``reply`` the value runs to the first ``]``. ``reply`` takes a
JSON text that may itself contain ``]``, so its value runs to the LAST ``]`` of the same text block
(put ``[sim:reply=…]`` last in its block). Directives are removed from the text the agent echoes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_DIRECTIVE = re.compile(r"\[sim:([a-z_]+)(?:=([^\]]*))?\]")
_REPLY_START = "[sim:reply="
USAGE_KINDS = frozenset({"input", "output", "cache_read", "active"})


@dataclass(slots=True)
class Directives:
    values: dict[str, str] = field(default_factory=dict)  # name -> value ("" when none)
    text: str = ""  # the message text, directives removed, stripped

    def has(self, name: str) -> bool:
        return name in self.values

    def get(self, name: str, default: str = "") -> str:
        return self.values.get(name, default)

    def number(self, name: str, default: float) -> float:
        try:
            return float(self.values[name])
        except (KeyError, ValueError):
            return default

    def usage(self) -> dict[str, float]:
        """``[sim:usage=input:1200,output:300,cache_read:0,active:30]``: what the turn reports it
        cost (tokens of each kind; `active` seconds added to the session's active time). Unknown
        kinds and unreadable counts are left out; an absent kind keeps its default."""
        counts: dict[str, float] = {}
        for part in self.get("usage").split(","):
            kind, _, value = part.partition(":")
            kind = kind.strip()
            if kind not in USAGE_KINDS:
                continue
            try:
                count = float(value)
            except ValueError:
                continue
            if count >= 0:
                counts[kind] = count
        return counts


def _parse_block(block: str, values: dict[str, str]) -> str:
    start = block.find(_REPLY_START)
    if start != -1:
        end = block.rfind("]")
        if end > start:
            values["reply"] = block[start + len(_REPLY_START) : end]
            block = block[:start] + block[end + 1 :]

    def collect(match: re.Match[str]) -> str:
        values[match.group(1)] = match.group(2) or ""
        return ""

    return _DIRECTIVE.sub(collect, block)


def parse_directives(text_blocks: list[str]) -> Directives:
    values: dict[str, str] = {}
    cleaned = [_parse_block(block, values) for block in text_blocks]
    return Directives(values=values, text="\n".join(cleaned).strip())
