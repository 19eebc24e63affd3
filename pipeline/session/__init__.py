"""Session-protocol client (docs/session-protocol.md). Knows nothing about Kafka or IM.

Public API::

    SessionClient(api_key=..., profile="ark"|"anthropic", base_url=None, timeout=30.0, connect_timeout=5.0,
                  stream_read_timeout=90.0, max_connections=16, max_keepalive_connections=16,
                  max_stream_connections=10_000, streams_per_pool=256, retry=RetryPolicy(), transport=None)
        await send(session_id, events) -> list[ServerEvent]      # split per profile, idempotent retries
        list(session_id, after=None, limit=100, order="asc")     # async iterator over all pages
        stream(session_id, deltas=())                            # async with ... as events: async for
        subscribe(session_id, after=None, deltas=False)          # resumable Subscription (.cursor)
        await get_session(id) / create_session(body) / delete_session(id)
    Subscription, Preview
    Provisioner, AnthropicProvisioner, StaticPoolProvisioner, ArkOpenAPIProvisioner
    RetryPolicy, Profile, ARK, ANTHROPIC
    parse_server_event(dict) -> ServerEvent (never raises), serialize_client_event(model) -> dict
    models: UserMessage, SystemMessage, UserInterrupt, UserToolConfirmation, UserToolResult,
            UserCustomToolResult, AgentMessage, SessionStatusIdle, ... (pipeline.session.models)
    errors: SessionAPIError, AuthError, NotFoundError, BadRequestError, RateLimitedError, ServerError,
            ProtocolError, TransportError, SendTimeoutError
"""

from pipeline.session import models
from pipeline.session.client import EventStream, SessionClient
from pipeline.session.exceptions import (
    AuthError,
    BadRequestError,
    NotFoundError,
    ProtocolError,
    RateLimitedError,
    SendTimeoutError,
    ServerError,
    SessionAPIError,
    TransportError,
)
from pipeline.session.models import (
    AgentMessage,
    ClientEvent,
    ServerEvent,
    SessionStatusIdle,
    SystemMessage,
    TextBlock,
    UnknownBlock,
    UnknownEvent,
    UserCustomToolResult,
    UserInterrupt,
    UserMessage,
    UserToolConfirmation,
    UserToolResult,
    parse_server_event,
    serialize_client_event,
)
from pipeline.session.previews import Preview
from pipeline.session.profiles import ANTHROPIC, ARK, Profile
from pipeline.session.provisioning import (
    AnthropicProvisioner,
    ArkOpenAPIProvisioner,
    Provisioner,
    StaticPoolProvisioner,
)
from pipeline.session.retry import RetryPolicy
from pipeline.session.subscription import Subscription, SubscriptionItem

__all__ = [
    "ANTHROPIC",
    "ARK",
    "AgentMessage",
    "AnthropicProvisioner",
    "ArkOpenAPIProvisioner",
    "AuthError",
    "BadRequestError",
    "ClientEvent",
    "EventStream",
    "NotFoundError",
    "Preview",
    "Profile",
    "ProtocolError",
    "Provisioner",
    "RateLimitedError",
    "RetryPolicy",
    "SendTimeoutError",
    "ServerError",
    "ServerEvent",
    "SessionAPIError",
    "SessionClient",
    "SessionStatusIdle",
    "StaticPoolProvisioner",
    "Subscription",
    "SubscriptionItem",
    "SystemMessage",
    "TextBlock",
    "TransportError",
    "UnknownBlock",
    "UnknownEvent",
    "UserCustomToolResult",
    "UserInterrupt",
    "UserMessage",
    "UserToolConfirmation",
    "UserToolResult",
    "models",
    "parse_server_event",
    "serialize_client_event",
]
