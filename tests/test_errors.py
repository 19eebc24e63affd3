"""One exception root: every package's errors are SwitchboardErrors."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import pipeline
from pipeline.connections.exceptions import ConnectionsError, FrameError, Refused
from pipeline.embedded.exceptions import EmbeddedServiceError
from pipeline.errors import ConfigurationError, SwitchboardError
from pipeline.kafka.exceptions import KafkaAdminError
from pipeline.platforms.exceptions import PlatformError
from pipeline.segments.exceptions import SegmentsError
from pipeline.segments.validation import _DuplicateKey
from pipeline.session.exceptions import SessionAPIError
from pipeline.settings import Settings
from pipeline.state.exceptions import StateError
from pipeline.worker import create_app


@pytest.mark.parametrize(
    "error",
    [
        ConnectionsError,
        EmbeddedServiceError,
        KafkaAdminError,
        PlatformError,
        SegmentsError,
        SessionAPIError,
        StateError,
        ConfigurationError,
    ],
)
def test_every_package_error_is_a_switchboard_error(error: type[Exception]) -> None:
    assert issubclass(error, SwitchboardError)


def test_a_worker_without_its_endpoints_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="SWITCHBOARD_KAFKA_BOOTSTRAP and SWITCHBOARD_REDIS_URL"):
        create_app(Settings(kafka_bootstrap=None, redis_url=None))


def _pipeline_modules() -> list[ModuleType]:
    """Every module of the `pipeline` package, imported (none runs anything on import: the
    command-line entry points are behind `if __name__ == "__main__"`)."""
    return [importlib.import_module(info.name) for info in pkgutil.walk_packages(pipeline.__path__, "pipeline.")]


# Exceptions that may derive from something other than SwitchboardError, each with why.
_OUTSIDE_THE_ROOT: set[str] = set()


def test_every_exception_defined_in_pipeline_is_a_switchboard_error() -> None:
    defined = [
        value
        for module in _pipeline_modules()
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == module.__name__
    ]
    outside = {
        f"{error.__module__}.{error.__qualname__}" for error in defined if not issubclass(error, SwitchboardError)
    }
    # The walk found the errors it should: a package error and module-private ones.
    assert {StateError, ConnectionsError, _DuplicateKey} <= set(defined)
    assert outside <= _OUTSIDE_THE_ROOT, f"not SwitchboardErrors: {sorted(outside - _OUTSIDE_THE_ROOT)}"


def test_connection_errors_keep_what_their_callers_catch() -> None:
    # A Lark frame that does not parse is still a ValueError; OneBot's refusal still carries its status.
    assert issubclass(FrameError, ValueError)
    refused = Refused(401, "bad_token")
    assert isinstance(refused, ConnectionsError)
    assert (refused.status, refused.reason, str(refused)) == (401, "bad_token", "401 bad_token")
