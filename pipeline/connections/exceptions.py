"""Errors of the long connections: every one is a `ConnectionsError`, so a `SwitchboardError`.

The public ones are raised out of a transport's dial (the manager counts them, and after a few the
lease goes to another worker) or out of the reverse-connection handshake (`Refused`: the web
handler answers with its status). The transports' module-internal retry signals (telegram's
`_Refused`, onebot's `_Closed`) stay private to their modules, but derive from `ConnectionsError` too.
"""

from __future__ import annotations

from pipeline.errors import SwitchboardError


class ConnectionsError(SwitchboardError):
    """Base class of every error raised by `pipeline.connections`."""


class FrameError(ConnectionsError, ValueError):
    """Bytes that are not a Lark `Frame` (still a `ValueError`, as a parse failure was before)."""


class StreamOpenFailed(ConnectionsError):
    """DingTalk's connections/open refused (wrong credentials, no Stream mode for the app): the dial
    fails, and after a few the lease goes to another worker. Its text never holds the secret or the
    ticket."""


class GatewayFailed(ConnectionsError):
    """A failure no reconnect cures (a wrong token, intents not enabled): its text names the fix."""


class PollFailed(ConnectionsError):
    """A call to the Bot API failed in a way polling again cannot fix (a wrong token): the dial
    fails, and after a few the lease goes to another worker. Its text never holds the token."""


class SocketOpenFailed(ConnectionsError):
    """`apps.connections.open` gave no URL: Slack's error code (never the token)."""


class EndpointFailed(ConnectionsError):
    """The endpoint request gave no URL: Lark's code and message (never the secret)."""


class Refused(ConnectionsError):
    """An incoming OneBot connection refused: the HTTP status and a short reason (a metric label)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"{status} {reason}")
        self.status = status
        self.reason = reason


__all__ = [
    "ConnectionsError",
    "EndpointFailed",
    "FrameError",
    "GatewayFailed",
    "PollFailed",
    "Refused",
    "SocketOpenFailed",
    "StreamOpenFailed",
]
