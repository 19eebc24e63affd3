"""Settings: environment `SWITCHBOARD_*` (nested with `__`) plus an optional TOML file for bots.

`SWITCHBOARD_CONFIG=/path/to/switchboard.toml` names the file; environment values win over it.
Bad settings fail fast with a message that names the field (pydantic's validation error).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

BusyPolicy = Literal["merge", "queue", "interrupt"]
SessionScope = Literal["chat", "user"]
Language = Literal["zh", "en"]
ConfirmPolicy = Literal["starter_and_admins", "admins", "anyone"]


class TriggerPolicy(BaseModel):
    """When a group message triggers the agent. Private messages always do."""

    model_config = ConfigDict(extra="forbid")

    mention: bool = True
    reply_to_bot: bool = True
    command_prefix: str | None = "/ask"
    keywords: list[str] = Field(default_factory=list)


class RateLimit(BaseModel):
    """`count` messages per `per_seconds`, shared by all workers through Redis."""

    model_config = ConfigDict(extra="forbid")

    count: int = Field(gt=0)
    per_seconds: float = Field(gt=0)


class BotConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    platform: str
    bot_id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # The bot's own user id on the platform (mentions of it trigger the agent).
    self_id: str | None = None
    # Telegram: the bot's @username, for `@username` mentions in text.
    username: str | None = None
    credentials: dict[str, SecretStr] = Field(default_factory=dict)
    # Override of the platform API base URL (stand-in servers in tests, private deployments).
    api_base: str | None = None
    trigger: TriggerPolicy = Field(default_factory=TriggerPolicy)
    session_scope: SessionScope = "chat"
    busy_policy: BusyPolicy = "merge"
    language: Language = "zh"
    leak_policy: Literal["redact", "block"] = "redact"
    mention_policy: Literal["plain", "reject", "allow"] = "plain"
    output_schema: bool = True
    progress: bool = False
    confirm_policy: ConfirmPolicy = "starter_and_admins"
    notices: dict[str, str] = Field(default_factory=dict)
    rate_limit_chat: RateLimit | None = None
    rate_limit_bot: RateLimit | None = None
    # Lark and Slack: a signed webhook whose timestamp is further than this from its receipt is
    # refused (401 stale_timestamp), so a captured request cannot be replayed later. Well below
    # the de-duplication window, which catches replays inside it.
    replay_window_seconds: int = Field(default=300, ge=30, le=3600)

    def secret(self, name: str) -> str | None:
        value = self.credentials.get(name)
        return value.get_secret_value() if value is not None else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SWITCHBOARD_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    # Infrastructure. `None` means "embedded" for `switchboard up`; `worker` requires them.
    kafka_bootstrap: str | None = None
    # Tansu never answers a fetch early, so the consumer's wait is pure latency there (see
    # ARCHITECTURE.md, measured facts). Small by default; raise it on a busy Apache Kafka.
    kafka_fetch_max_wait_ms: int = Field(default=20, ge=1, le=10_000)
    # Tansu answers a group join only after about half the session timeout: keep it short so a
    # worker joins (and a dead one is noticed) in seconds. Apache Kafka is fine with it too.
    kafka_session_timeout_seconds: float = Field(default=10.0, ge=3.0, le=300.0)
    # Producer batching: a few milliseconds per hop buys far fewer, larger produce requests.
    kafka_linger_ms: int = Field(default=5, ge=0, le=1000)
    partitions: int = Field(default=8, ge=1, le=1024)
    replication_factor: int = Field(default=1, ge=1)
    app_id: str = "switchboard"
    redis_url: str | None = None
    redis_prefix: str = "sb:"
    redis_max_connections: int = Field(default=1024, ge=4)

    # Session API.
    session_base_url: str | None = None
    session_profile: Literal["ark", "anthropic"] = "ark"
    session_api_key: SecretStr | None = None
    session_provisioner: Literal["static", "anthropic", "ark-openapi"] = "anthropic"
    session_agent_id: str = "switchboard-agent"
    session_environment_id: str = "env-default"
    session_static_ids: list[str] = Field(default_factory=list)
    ark_access_key: SecretStr | None = None
    ark_secret_key: SecretStr | None = None
    ark_openapi_url: str | None = None
    session_timeout_seconds: float = Field(default=30.0, gt=0)
    session_max_connections: int = Field(default=200, ge=1)

    # Correction call (OpenAI-compatible chat completions). Unset: invalid replies go to the notice.
    correction_base_url: str | None = None
    correction_api_key: SecretStr | None = None
    correction_model: str = "doubao-seed-1-6"
    correction_timeout_seconds: float = Field(default=30.0, gt=0)

    # Media checks.
    media_root: Path | None = None
    media_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1)

    # Web (ingress, console, metrics, health).
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=8080, ge=0, le=65535)

    # State.
    mapping_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60)
    dedup_ttl_seconds: int = Field(default=24 * 3600, ge=60)
    group_context_size: int = Field(default=20, ge=0, le=500)
    merge_window_max: int = Field(default=20, ge=1)

    # Keyed executor: calls to slow APIs in flight at once, across conversations.
    max_in_flight: int = Field(default=256, ge=1)
    # Records a stage takes together when they are already fetched (one Redis round trip each).
    batch_max: int = Field(default=256, ge=1)
    egress_max_attempts: int = Field(default=5, ge=1)
    # On SIGTERM: take no new turns and let the running ones finish, for at most this long.
    shutdown_drain_seconds: float = Field(default=20.0, ge=0, le=600)

    log_format: Literal["json", "text"] = "text"
    log_level: str = "INFO"

    bots: list[BotConfig] = Field(default_factory=list)

    @field_validator("redis_prefix")
    @classmethod
    def _prefix_ends_with_colon(cls, value: str) -> str:
        return value if value.endswith(":") else value + ":"

    @model_validator(mode="after")
    def _default_console_bot(self) -> Settings:
        # With no bots configured, the console's demo bot makes `make run` useful at once.
        if not self.bots:
            self.bots = [BotConfig(platform="console", bot_id="demo", self_id="bot", language="en")]
        seen: set[tuple[str, str]] = set()
        for bot in self.bots:
            key = (bot.platform, bot.bot_id)
            if key in seen:
                raise ValueError(f"bot {bot.platform}/{bot.bot_id} is configured twice")
            seen.add(key)
        return self

    def bot(self, platform: str, bot_id: str) -> BotConfig | None:
        for bot in self.bots:
            if bot.platform == platform and bot.bot_id == bot_id:
                return bot
        return None

    @property
    def platforms(self) -> list[str]:
        return sorted({bot.platform for bot in self.bots})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlFileSource(settings_cls))


class _TomlFileSource(PydanticBaseSettingsSource):
    """Reads the file named by `SWITCHBOARD_CONFIG`, if any."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        path = os.environ.get("SWITCHBOARD_CONFIG")
        self._data: dict[str, Any] = {}
        if path:
            try:
                self._data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
            except (OSError, tomllib.TOMLDecodeError) as exc:
                raise ValueError(f"SWITCHBOARD_CONFIG={path}: {exc}") from exc

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._data)
