"""Exceptions of the reply contract.

Messages never carry reply content: they hold a short machine-readable reason only, so they can be
logged and counted without leaking what the model wrote.
"""

from __future__ import annotations

from pipeline.errors import SwitchboardError


class SegmentsError(SwitchboardError):
    """Base class of every error raised by `pipeline.segments`."""


class ReplyInvalid(SegmentsError):
    """The reply text is not one valid `{"segments": [...]}` object (S8, S10).

    `reason` is a short code such as `invalid_json` or `schema:segments.2.data.text:missing`; it names
    positions and known field names only, never values or unknown keys taken from the reply.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CorrectionFailed(SegmentsError):
    """The single correction call did not produce a usable reply (timeout, HTTP error, bad body)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MediaUnavailable(SegmentsError):
    """A media source could not be read, was refused, was too big, or did not match its segment."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnsafeAddress(MediaUnavailable):
    """A URL (or one of its redirect hops) resolves to an address the fetcher must not contact."""
