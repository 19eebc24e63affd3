"""One exception root: every package's errors are SwitchboardErrors."""

from __future__ import annotations

import pytest

from pipeline.embedded.exceptions import EmbeddedServiceError
from pipeline.errors import ConfigurationError, SwitchboardError
from pipeline.kafka.exceptions import KafkaAdminError
from pipeline.platforms.exceptions import PlatformError
from pipeline.segments.exceptions import SegmentsError
from pipeline.session.exceptions import SessionAPIError
from pipeline.settings import Settings
from pipeline.state.exceptions import StateError
from pipeline.worker import create_app


@pytest.mark.parametrize(
    "error",
    [
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
