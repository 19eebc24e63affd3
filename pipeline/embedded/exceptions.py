"""Errors raised by the embedded service supervisors."""

from __future__ import annotations

from pipeline.errors import SwitchboardError


class EmbeddedServiceError(SwitchboardError, RuntimeError):
    """Base class for embedded service failures."""


class ServiceStartError(EmbeddedServiceError):
    """The process exited or did not become ready in time (the message carries the log tail)."""


class PortInUseError(ServiceStartError):
    """A port the service must listen on is held by another process."""

    def __init__(self, service: str, host: str, port: int, detail: str = "") -> None:
        super().__init__(f"{service}: port {port} on {host} is already in use" + (f"; {detail}" if detail else ""))
        self.service = service
        self.host = host
        self.port = port


class ServiceStopError(EmbeddedServiceError):
    """The process could not be stopped."""


class BinaryNotFoundError(EmbeddedServiceError):
    """A required executable (tansu, redis-server, java, mvn) is not available."""
