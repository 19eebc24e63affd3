"""Errors raised by the embedded service supervisors."""

from __future__ import annotations

from pipeline.errors import SwitchboardError


class EmbeddedServiceError(SwitchboardError, RuntimeError):
    """Base class for embedded service failures."""


class ServiceStartError(EmbeddedServiceError):
    """The process exited or did not become ready in time (the message carries the log tail)."""


class ServiceStopError(EmbeddedServiceError):
    """The process could not be stopped."""


class BinaryNotFoundError(EmbeddedServiceError):
    """A required executable (tansu, redis-server, java, mvn) is not available."""
