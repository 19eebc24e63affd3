"""Errors raised by the session client. Every one derives from :class:`SessionAPIError`."""

from __future__ import annotations

from pipeline.errors import SwitchboardError


class SessionAPIError(SwitchboardError):
    """Base class. ``status`` is the HTTP status when one was received, ``body`` the decoded error body."""

    def __init__(self, message: str, *, status: int | None = None, body: object = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


class AuthError(SessionAPIError):
    """401/403: the credentials were refused. Not retried."""


class NotFoundError(SessionAPIError):
    """404: the session (or event) does not exist, e.g. it was deleted."""


class BadRequestError(SessionAPIError):
    """400/409/422: the server rejected the request (e.g. a lone system.message, P5). Not retried."""


class RateLimitedError(SessionAPIError):
    """429 after retries were exhausted. ``retry_after`` is the server's hint in seconds, if any."""

    def __init__(
        self, message: str, *, status: int | None = 429, body: object = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, status=status, body=body)
        self.retry_after = retry_after


class ServerError(SessionAPIError):
    """5xx after retries were exhausted."""


class ProtocolError(SessionAPIError):
    """The peer broke the protocol (malformed body, SSE ``event: error``) or the caller asked for a batch
    the protocol forbids (e.g. a system.message not right after a user.message)."""


class TransportError(SessionAPIError):
    """Connection-level failure (refused, reset) after retries were exhausted."""


class SendTimeoutError(TransportError):
    """A send timed out and could not be confirmed in history; it may or may not have been accepted."""
