"""Errors raised by platform modules."""

from pipeline.errors import SwitchboardError


class PlatformError(SwitchboardError):
    """Base class of platform errors."""


class WebhookRejected(PlatformError):
    """A webhook that must be answered with a 4xx. `reason` is a short metric label."""

    def __init__(self, status: int, reason: str, detail: str = "") -> None:
        super().__init__(f"{status} {reason}: {detail}" if detail else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.detail = detail


class UnknownPlatform(PlatformError):
    pass
