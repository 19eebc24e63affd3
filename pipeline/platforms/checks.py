"""What each platform asks of its bots, checked against the bots a deployment configures.

The settings hold bots as plain data and know no platform; these checks know every platform: the
platform's name, the transports it offers, the credentials it and the transport need, and fields
that must fit together (`Platform.settings_problems`). `bot_problems` reads the entries as written,
so that the settings loader reports them together with the settings' own errors even when an
entry is invalid otherwise; `check_bots` is the same check on settings already built (a worker
starting from settings made in code).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import SecretStr

from pipeline.errors import ConfigurationError
from pipeline.platforms import Platform, UnknownPlatform, get_platform, known_platforms
from pipeline.settings import BotConfig, BotProblem, Settings

__all__ = ["bot_problems", "check_bots"]


def bot_problems(entries: Sequence[Mapping[str, Any] | BotConfig]) -> list[BotProblem]:
    """Every problem of every entry, each located by the entry's index and its field."""
    problems: list[BotProblem] = []
    for index, entry in enumerate(entries):
        if isinstance(entry, BotConfig):
            entry = entry.model_dump()
        if isinstance(entry, Mapping):
            problems.extend(BotProblem((index, *loc), message) for loc, message in _entry_problems(entry))
    return problems


def check_bots(settings: Settings) -> None:
    """Raise a ConfigurationError listing every problem of the settings' bots."""
    problems = bot_problems(settings.bots)
    if problems:
        raise ConfigurationError(*(f"bots[{p.loc[0]}].{'.'.join(map(str, p.loc[1:]))}: {p.message}" for p in problems))


def _entry_problems(entry: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    name, assumed = _platform_name(entry)
    bot = f"bot {entry.get('bot_id', '?')!r}"
    transport = entry.get("transport", "webhook")
    if name is None:
        # No platform to check against (the fields' own errors say it is missing); a transport that
        # no platform offers is wrong whatever the platform turns out to be.
        offered = {t for p in known_platforms() for t in get_platform(p).transports}
        if isinstance(transport, str) and transport not in offered:
            message = f"no platform offers transport {transport!r} ({bot}){_did_you_mean(transport, offered)}"
            return [(("transport",), message)]
        return []
    try:
        platform = get_platform(name)
    except UnknownPlatform:
        known = ", ".join(known_platforms())
        where = "platform" if assumed is None else assumed
        return [((where,), f"unknown platform {name!r}; known: {known}")]
    if assumed is not None:
        bot = f"{bot}, taking {assumed} = {name!r} for platform"
    return _platform_problems(platform, entry, transport, bot)


def _platform_name(entry: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """The entry's platform, and the misspelt key it was found under (`platfrom`), if it was:
    the transport and credentials of an entry with a typo in one key are still checked."""
    name = entry.get("platform")
    if isinstance(name, str):
        return name, None
    if name is None:
        for key in difflib.get_close_matches("platform", [k for k in entry if isinstance(k, str)], n=1, cutoff=0.75):
            if isinstance(entry[key], str):
                return entry[key], key
    return None, None


def _platform_problems(
    platform: Platform, entry: Mapping[str, Any], transport: Any, bot: str
) -> list[tuple[tuple[str, ...], str]]:
    name = platform.name
    credentials = entry.get("credentials")
    given = {k for k, v in credentials.items() if _filled(v)} if isinstance(credentials, Mapping) else set()
    problems: list[tuple[tuple[str, ...], str]] = []
    needed = platform.required_credentials
    if not isinstance(transport, str) or transport not in platform.transports:
        offers = ", ".join(platform.transports)
        hint = _did_you_mean(transport, set(platform.transports)) if isinstance(transport, str) else ""
        message = f"{name} does not offer transport {transport!r} ({bot}); it offers: {offers}{hint}"
        problems.append((("transport",), message))
    else:
        needed = (*needed, *platform.transports[transport])
    for field, message in platform.settings_problems(entry):
        problems.append(((field,), f"{message} ({bot})"))
    for required in needed:
        if isinstance(required, str):
            if required not in given:
                why = name if required in platform.required_credentials else f"{name} {transport}"
                problems.append((("credentials", required), f"required for {why} ({bot})"))
        elif given.isdisjoint(required):
            problems.append((("credentials",), f"{' or '.join(required)} is required for {name} ({bot})"))
    return problems


def _did_you_mean(word: str, choices: set[str]) -> str:
    # Close only: a misspelling (`ws_reverse`), not another word (`websocket` is not `webhook`).
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.8)
    return f"; did you mean {close[0]!r}?" if close else ""


def _filled(value: Any) -> bool:
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    return value is not None and value != ""
