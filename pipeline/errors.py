"""The root of every error Switchboard raises: `except SwitchboardError` catches them all.

Each package has its own errors below it: `session.exceptions.SessionAPIError`,
`segments.exceptions.SegmentsError`, `platforms.exceptions.PlatformError`,
`state.exceptions.StateError`, `kafka.exceptions.KafkaAdminError`,
`embedded.exceptions.EmbeddedServiceError`, and `ConfigurationError` for bad settings.
"""

from __future__ import annotations


class SwitchboardError(Exception):
    """Base of all of Switchboard's errors."""


class ConfigurationError(SwitchboardError, ValueError):
    """A setting or the bots file is wrong; the message names what and how to fix it. A check that
    finds several problems reports them all at once: `problems` holds one line per problem."""

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems = list(problems)
