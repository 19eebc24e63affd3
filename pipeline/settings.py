"""Settings: environment `SWITCHBOARD_*` (nested with `__`) plus an optional TOML file for bots.

`SWITCHBOARD_CONFIG=/path/to/switchboard.toml` names the file; environment values win over it.
Bad settings fail fast: `load_settings` reports every problem at once, each naming what the user
set (the variable, or the bots file and entry: `bots[2].credentials.signing_secret`), and what a
command needs that is not set.

The settings are plain data: they know no platform and no web surface. What a platform asks of
its bots (`pipeline.platforms.checks`) and what a worker may not serve (`pipeline.web`) are
checks the command passes to `load_settings`, which reports them in the same list.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from pipeline.controls.budgets import Budgets
from pipeline.controls.limits import LimitsConfig
from pipeline.controls.moderation import ModerationConfig
from pipeline.controls.overload import OverloadConfig
from pipeline.errors import ConfigurationError

BusyPolicy = Literal["merge", "queue", "interrupt"]
SessionScope = Literal["chat", "user"]
Language = Literal["zh", "en"]
ConfirmPolicy = Literal["starter_and_admins", "admins", "anyone"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


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
    # Telegram: the bot's @username, for `@username` mentions in text. Matrix: its display name, for
    # mentions from clients without `m.mentions`.
    username: str | None = None
    credentials: dict[str, SecretStr] = Field(default_factory=dict)
    # Override of the platform API base URL (stand-in servers in tests, private deployments). For a
    # transport Switchboard dials (OneBot `ws-forward`), the address it connects to.
    api_base: str | None = None
    # How the platform and Switchboard reach each other: `webhook` (the default: the platform posts to
    # `/webhooks/{platform}/{bot_id}`) or a long connection the platform module offers
    # (`Platform.transports`; OneBot: `ws-reverse`, `ws-forward`; Telegram: `polling`; Slack:
    # `socket_mode`; Lark: `long_connection`), held by one worker at a time.
    transport: str = "webhook"
    # Telegram `polling`: call deleteWebhook when polling starts (without it, a webhook still set is
    # an error the holder logs and counts), and how long one getUpdates waits for updates (Matrix
    # `sync`: how long one /sync waits).
    delete_webhook: bool = False
    poll_timeout_seconds: int = Field(default=30, ge=1, le=50)
    trigger: TriggerPolicy = Field(default_factory=TriggerPolicy)
    session_scope: SessionScope = "chat"
    busy_policy: BusyPolicy = "merge"
    language: Language = "zh"
    leak_policy: Literal["redact", "block"] = "redact"
    mention_policy: Literal["plain", "reject", "allow"] = "plain"
    output_schema: bool = True
    progress: bool = False
    confirm_policy: ConfirmPolicy = "starter_and_admins"
    # User ids that may answer any tool confirmation in this bot's chats, on every platform (besides
    # admins the platform itself reports, such as a OneBot group owner). Never taken from a request.
    admins: list[str] = Field(default_factory=list)
    notices: dict[str, str] = Field(default_factory=dict)
    rate_limit_chat: RateLimit | None = None
    rate_limit_bot: RateLimit | None = None
    # Lark, Slack, WeCom and QQ bot: a signed webhook whose timestamp is further than this from its
    # receipt is refused (401 stale_timestamp), so a captured request cannot be replayed later. Well
    # below the de-duplication window, which catches replays inside it.
    replay_window_seconds: int = Field(default=300, ge=30, le=3600)
    # QQ bot: send active messages (no user message answered) where a passive reply is no longer
    # possible: past the reply window, past the 5 replies to one message, with no message to answer.
    # Off, such a message is dead-lettered. QQ allows few (4 a month per user or group).
    # LINE: push a message whose reply token is used or expired (pushes count against the
    # channel's monthly quota); off, it is dead-lettered (`reply_token_expired`).
    active_messages: bool = False
    # Where the platform closes replies to a message after a while (QQ bot: its passive-reply
    # window): a turn still running this long before then gets the notice `reply_window_closing`
    # (`reply_window_closing_active` with `active_messages`), once. 0: no notice.
    reply_window_notice_seconds: float = Field(default=30.0, ge=0, le=600)
    # Discord's Gateway: the shard `[index, count]` this bot entry's connection IDENTIFYs as. A bot in
    # more than 2,500 guilds must shard: one bot entry per shard (same token, a bot_id each), each
    # held under its own lease by whichever worker wins it.
    shard: tuple[int, int] = (0, 1)
    # Controls for busy chats (docs/controls.md): inbound rate limits, moderation, and how long a
    # message may wait for its turn under overload.
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    moderation: ModerationConfig = Field(default_factory=ModerationConfig)
    overload: OverloadConfig = Field(default_factory=OverloadConfig)
    # Usage budgets (tokens, active seconds) per chat, user and bot over a day or month
    # (docs/controls.md, "Usage budgets"). Off unless a limit is set.
    budgets: Budgets = Field(default_factory=Budgets)

    @field_validator("shard")
    @classmethod
    def _shard_in_range(cls, value: tuple[int, int]) -> tuple[int, int]:
        index, count = value
        if not (count >= 1 and 0 <= index < count):
            raise ValueError(f"shard [{index}, {count}]: needs 0 <= index < count")
        return value

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
    # docs/architecture.md, "Measured facts"). Small by default; raise it on a busy Apache Kafka.
    kafka_fetch_max_wait_ms: int = Field(default=20, ge=1, le=10_000)
    # Tansu answers a group join only after about half the session timeout: keep it short so a
    # worker joins (and a dead one is noticed) in seconds. Apache Kafka is fine with it too.
    kafka_session_timeout_seconds: float = Field(default=10.0, ge=3.0, le=300.0)
    # Idempotent producer (with acks=all): a write retried after a broker failure is stored once.
    # Needs a broker with InitProducerId; the embedded Tansu fails it, so the local stack turns it off.
    kafka_idempotence: bool = True
    # How long a produced record may wait for others to share its request. aiokafka keeps one
    # request in flight per broker and batches whatever arrives meanwhile, so a busy worker batches
    # without it; a linger only adds itself to every hop (bench/README.md, "The producer's linger").
    kafka_linger_ms: int = Field(default=0, ge=0, le=1000)
    # The most bytes of one partition's records one produce request carries. With one request in
    # flight per broker, a partition's produce rate is at most this per round trip: at aiokafka's
    # 16 KiB, a chat flooding triggers (user turns of a few KiB each, with their context) outran
    # its partition once the broker's round trip grew (bench/README.md, "Fairness under a flood").
    kafka_max_batch_bytes: int = Field(default=262144, ge=1024, le=1048576)
    partitions: int = Field(default=8, ge=1, le=1024)
    # Replicas of each topic `topics apply` creates (capped to the brokers there are, so one dev
    # broker still works); with topics.toml's min.insync.replicas=2, a broker can fail losing nothing.
    replication_factor: int = Field(default=3, ge=1)
    app_id: str = "switchboard"
    redis_url: str | None = None
    redis_prefix: str = "sb:"
    redis_max_connections: int = Field(default=1024, ge=4)
    # After the writes whose loss in a failover could post twice, wait this long at most for one
    # replica to confirm them (`WAIT 1 <ms>`); 0: do not wait (docs/operations.md, Redis failover).
    redis_replica_wait_ms: int = Field(default=0, ge=0, le=10_000)

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
    # A connection must deliver a whole request (headers and body) within this many seconds of being
    # accepted or of its previous answer, or it is closed: silent, idle between requests, mid-head or
    # mid-body alike (`pipeline/web/_guard.py`). A request that is all in is never cut.
    web_request_timeout_seconds: float = Field(default=10.0, gt=0, le=600)
    # aiohttp's keep-alive time; an idle connection is closed at the request deadline above when that
    # is shorter (by default it is: idle connections last 10 s, not 75 s).
    web_keepalive_seconds: float = Field(default=75.0, gt=0, le=3600)
    # Connections per worker holding a slot (console streams included). At the cap a new connection
    # takes the slot of the one that has waited longest without a whole request; when every slot is
    # answering, a few more are let in for /healthz, /readyz and /metrics only.
    web_max_connections: int = Field(default=2048, ge=1)
    # On: webhooks are answered without the app's router (`pipeline/web/_front.py`); off: through
    # the app's route. aiohttp's parser reads every request either way, and the answers are the same.
    web_webhook_front: bool = True
    # `Authorization: Bearer <token>` required on /metrics when set (/healthz and /readyz stay open).
    metrics_token: SecretStr | None = None

    # The console (`/console/`, its API and console bots): a development and demo surface, off
    # unless enabled (`switchboard up` enables it). Enabled without a console bot: the bot `demo`.
    console_enabled: bool = False
    # The bearer token of the `demo` console bot (a configured console bot has `credentials.token`).
    console_token: SecretStr | None = None
    # Open console streams per worker at most; one more gets 429.
    console_max_viewers: int = Field(default=256, ge=1)

    # State.
    mapping_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60)
    dedup_ttl_seconds: int = Field(default=24 * 3600, ge=60)
    group_context_size: int = Field(default=20, ge=0, le=500)
    # How long a small batch of messages that produce nothing (group chatter) may wait to share the
    # Redis call of the next turn's admission: what it saves is a round trip per such batch; what
    # it costs is that much later an acknowledgement for them (never a reply's latency). 0: never.
    ingest_admission_linger_ms: int = Field(default=50, ge=0, le=1000)
    merge_window_max: int = Field(default=20, ge=1)

    # Keyed executor: calls to slow APIs in flight at once, across conversations.
    max_in_flight: int = Field(default=256, ge=1)
    # Records a stage takes together when they are already fetched (one Redis round trip each).
    batch_max: int = Field(default=256, ge=1)
    egress_max_attempts: int = Field(default=5, ge=1)
    # Long connections (docs/architecture.md, "Long connections"): a holder's lease lasts this long
    # unless renewed (every third of it), so a dead holder's bots are free again after at most this;
    # workers without a bot's lease try to take it this often. Takeover after a crash: within
    # lease + acquire interval (+ the connect itself).
    connection_lease_seconds: float = Field(default=6.0, ge=1.0, le=300.0)
    connection_acquire_interval_seconds: float = Field(default=1.0, ge=0.05, le=60.0)
    # An action sent over a held connection from any worker (a reply): how long the sender waits for
    # the holder's answer before the send is retried.
    connection_action_timeout_seconds: float = Field(default=10.0, ge=0.5, le=120.0)
    # A frame read from a held connection whose produce fails (a partition leader moving, the
    # broker restarting) is sent again for this long before it is given up (and, on platforms that
    # acknowledge, left unacknowledged for the platform to deliver again).
    connection_produce_patience_seconds: float = Field(default=30.0, ge=0.5, le=600.0)
    # On SIGTERM: take no new turns and let the running ones finish, for at most this long.
    shutdown_drain_seconds: float = Field(default=20.0, ge=0, le=600)

    # When the event loop is held this long, every thread's stack goes to the log (0: never).
    loop_stall_dump_seconds: float = Field(default=5.0, ge=0, le=600)

    # `switchboard bench`'s finer stamps in each record's hops (pipeline/hopstamps.py): the parts
    # of each Kafka hop (produce, broker + fetch, step, queue, handle). Off outside the bench.
    hop_stamps: bool = False

    log_format: Literal["json", "text"] = "text"
    # Checked here, with every other setting: an unknown level would otherwise stop the worker
    # only once the broker, Redis and the simulator are already up.
    log_level: LogLevel = "INFO"

    bots: list[BotConfig] = Field(default_factory=list)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_capitals(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("redis_prefix")
    @classmethod
    def _prefix_ends_with_colon(cls, value: str) -> str:
        return value if value.endswith(":") else value + ":"

    @field_validator("console_token", "metrics_token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        # `SWITCHBOARD_CONSOLE_TOKEN=` (an unset compose variable) means no token, not "".
        return value if value is not None and value.get_secret_value() else None

    @model_validator(mode="after")
    def _acquire_within_lease(self) -> Settings:
        if self.connection_acquire_interval_seconds >= self.connection_lease_seconds:
            raise ValueError(
                f"{env_name('connection_acquire_interval_seconds')} must be shorter than "
                f"{env_name('connection_lease_seconds')}"
            )
        return self

    @model_validator(mode="after")
    def _provisioner_of_the_profile(self) -> Settings:
        # Unset, the provisioner is the one the profile can create sessions with: Ark creates them
        # through Volcengine OpenAPI only (docs/session-protocol.md), Anthropic on its data plane.
        if "session_provisioner" not in self.model_fields_set:
            self.session_provisioner = "ark-openapi" if self.session_profile == "ark" else "anthropic"
        return self

    @model_validator(mode="after")
    def _default_console_bot(self) -> Settings:
        # The console enabled without a console bot of its own: the `demo` bot, so that
        # `switchboard up` is useful at once.
        if self.console_enabled and not any(b.platform == "console" for b in self.bots):
            credentials = {"token": self.console_token} if self.console_token is not None else {}
            self.bots = [
                *self.bots,
                BotConfig(platform="console", bot_id="demo", self_id="bot", language="en", credentials=credentials),
            ]
        seen: set[tuple[str, str]] = set()
        for bot in self.bots:
            key = (bot.platform, bot.bot_id)
            if key in seen:
                raise ValueError(f"bot {bot.platform}/{bot.bot_id} is configured twice")
            seen.add(key)
        return self

    def bot(self, platform: str, bot_id: str) -> BotConfig | None:
        """The bot `platform`/`bot_id`, or None: one dict look-up (every message of every stage
        asks, and a deployment may have hundreds of bots)."""
        return self._bots_by_key().get((platform, bot_id))

    # A cached property, not a pydantic private attribute: those are read through the model's
    # `__getattr__`, which made this look-up cost 5 µs instead of 0.2 (it runs many times a turn).
    @functools.cached_property
    def _bot_index(self) -> tuple[list[BotConfig], dict[tuple[str, str], BotConfig]]:
        return (self.bots, {(b.platform, b.bot_id): b for b in self.bots})

    def _bots_by_key(self) -> dict[tuple[str, str], BotConfig]:
        # Built once per bots list. A list put in its place afterwards (an assignment, or
        # `model_copy(update={"bots": …})`, which validates nothing) is a different object, so it
        # gets an index of its own instead of a stale one.
        index = self._bot_index
        if index[0] is not self.bots:
            del self._bot_index
            index = self._bot_index
        return index[1]

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


# -- loading for a command: every problem at once, named as the user set it --------------------------

Command = Literal["up", "worker", "topics", "deadletters", "conversation"]
_ENV_PREFIX = "SWITCHBOARD_"
_CONFIG_VAR = "SWITCHBOARD_CONFIG"
# Fields whose values never appear in an error message.
_SECRET_WORDS = ("key", "secret", "token", "password", "credentials")


class BotProblem(NamedTuple):
    """A problem of one bots entry that a check beyond the settings' own finds (each platform's
    requirements, `pipeline.platforms.checks`). `loc`: the entry's index, then the field, as in
    `(2, "credentials", "signing_secret")`."""

    loc: tuple[int | str, ...]
    message: str


# What a command checks besides the settings' own fields, reported in the same list. A bots check
# reads the entries as written (mappings, valid or not, or `BotConfig`s once the settings are valid),
# so that one invalid field does not hide the rest of its entry's problems.
BotsCheck = Callable[[Sequence[Any]], list[BotProblem]]
# What the command cannot run with, asked of valid settings.
SettingsCheck = Callable[["Settings"], list[str]]


def env_name(field: str) -> str:
    """The variable that sets a field: `partitions` → `SWITCHBOARD_PARTITIONS`."""
    return _ENV_PREFIX + field.upper()


def load_settings(
    command: Command, *, bots_check: BotsCheck | None = None, settings_check: SettingsCheck | None = None
) -> Settings:
    """The settings for `command`, or a `ConfigurationError` listing every problem: invalid values
    (named by variable, or by bots-file entry and field), what `bots_check` finds in the bots, what
    the command needs but is unset, and, for valid settings, what `settings_check` refuses."""
    settings: Settings | None = None
    errors: list[Mapping[str, Any]] = []
    problems: list[str] = []
    try:
        settings = Settings()
    except ValidationError as exc:
        errors.extend(exc.errors(include_url=False))
    except ValueError as exc:  # the bots file cannot be read or parsed
        problems.append(str(exc))
    if bots_check is not None:
        entries = settings.bots if settings is not None else _raw_bots()
        errors.extend({"loc": ("bots", *problem.loc), "msg": problem.message} for problem in bots_check(entries))
    # One entry's problems together, in the order of the entries; the rest first, as they came.
    errors.sort(key=_entry_index)
    problems.extend(describe_errors(errors))
    problems.extend(f"{name} is not set ({why})" for name, why in missing_settings(command, settings))
    if settings is not None and settings_check is not None:
        problems.extend(settings_check(settings))
    if problems:
        raise ConfigurationError(*problems)
    assert settings is not None
    return settings


def _entry_index(error: Mapping[str, Any]) -> int:
    loc = error["loc"]
    return loc[1] if len(loc) > 1 and loc[0] == "bots" and isinstance(loc[1], int) else -1


def _raw_bots() -> list[Any]:
    """The bots as written, unvalidated (a JSON list in `SWITCHBOARD_BOTS`, else the bots file's)."""
    raw = _raw_value("bots")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []  # the settings' own error says so
    return raw if isinstance(raw, list) else []


# `SWITCHBOARD_*` variables that are no settings but are read elsewhere: the bots file's name, the
# embedded services' binaries and caches, the worker's development aids, the test suite's broker
# and tier. A variable read anywhere else belongs here (tests/test_settings.py checks the tree).
OTHER_VARIABLES = frozenset(
    {
        _CONFIG_VAR,
        "SWITCHBOARD_CACHE_DIR",
        "SWITCHBOARD_CHROMIUM",
        "SWITCHBOARD_CPROFILE",
        "SWITCHBOARD_EVENT_LOOP",
        "SWITCHBOARD_INSTANCE_ID",
        "SWITCHBOARD_KAFKA_LIBS",
        "SWITCHBOARD_KAFKA_POM",
        "SWITCHBOARD_KEEP_RUN_DIRS",
        "SWITCHBOARD_REDIS_SERVER_BIN",
        "SWITCHBOARD_TANSU_BIN",
        "SWITCHBOARD_TEST_BROKERS",
        "SWITCHBOARD_TEST_TIER",
    }
)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """A warning for each `SWITCHBOARD_*` variable that nothing reads, naming the closest known one.
    Unknown variables are otherwise ignored without a word: `SWITCHBOARD_REDIS_ULR` would leave
    `switchboard up` on its embedded Redis."""
    environ = os.environ if environ is None else environ
    known = {env_name(field) for field in Settings.model_fields} | OTHER_VARIABLES
    # Compared without the prefix every name shares, which would make any two names look alike.
    suffixes = sorted(name.removeprefix(_ENV_PREFIX) for name in known)
    warnings = []
    for name in sorted(environ):
        # Any case, as the settings read them; `SWITCHBOARD_BOTS__0__BOT_ID` is a value of `bots`.
        root = name.upper().split("__")[0]
        if not root.startswith(_ENV_PREFIX) or root in known:
            continue
        close = difflib.get_close_matches(root.removeprefix(_ENV_PREFIX), suffixes, n=1)
        hint = (
            f"did you mean {_ENV_PREFIX}{close[0]}?" if close else "the settings are listed in README.md, Configuration"
        )
        warnings.append(f"{name} is not a setting and is ignored; {hint}")
    return warnings


def missing_settings(command: Command, settings: Settings | None = None) -> list[tuple[str, str]]:
    """(variable, what it is) for each setting `command` needs and nobody set. Without valid
    settings, what was set is read from the environment and the bots file directly."""
    value: Callable[[str], Any]
    if settings is not None:
        value = lambda name: getattr(settings, name)  # noqa: E731
    else:
        value = _raw_value
    needed: list[tuple[str, str]] = []
    if command in ("worker", "topics", "deadletters", "conversation"):
        needed.append(("kafka_bootstrap", "the Kafka bootstrap servers, e.g. kafka-1:9092,kafka-2:9092"))
    if command in ("worker", "deadletters", "conversation"):
        needed.append(("redis_url", "the Redis URL, e.g. redis://redis:6379/0"))
    if command == "worker":
        needed.append(("session_base_url", "the session API, e.g. https://ark.cn-beijing.volces.com/api/v3"))
    # `up` starts the simulator unless a session API is given; a given one needs its credentials.
    if command == "worker" or (command == "up" and value("session_base_url")):
        needed.append(("session_api_key", "the session API key"))
        provisioner = value("session_provisioner")
        if provisioner == "static":
            needed.append(("session_static_ids", "the static provisioner's Ark session ids, a JSON list"))
        elif provisioner == "ark-openapi":
            needed.append(("ark_access_key", "the Volcengine access key the ark-openapi provisioner signs with"))
            needed.append(("ark_secret_key", "the Volcengine secret key the ark-openapi provisioner signs with"))
    return [(env_name(name), why) for name, why in needed if not value(name)]


def _raw_value(field: str) -> Any:
    """A field as set in the environment or the bots file (unvalidated), else its default."""
    for key, raw in os.environ.items():
        if key.upper() == env_name(field):
            return raw
    data = _config_data()
    if field in data:
        return data[field]
    return Settings.model_fields[field].default if field in Settings.model_fields else None


def _config_data() -> dict[str, Any]:
    path = os.environ.get(_CONFIG_VAR)
    if not path:
        return {}
    try:
        return tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def describe_errors(errors: ValidationError | Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per error, naming what the user set: `SWITCHBOARD_PARTITIONS=0: …`, or
    `bots.toml: bots[2].credentials.signing_secret: …` for the bots file."""
    if isinstance(errors, ValidationError):
        errors = errors.errors(include_url=False)
    config_path = os.environ.get(_CONFIG_VAR)
    in_file = set(_config_data())
    env_upper = {key.upper(): raw for key, raw in os.environ.items()}
    lines = []
    for error in errors:
        loc = error["loc"]
        message = str(error["msg"]).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            close = difflib.get_close_matches(str(loc[-1]), _fields_at(loc), n=1)
            message += f"; did you mean {close[0]!r}?" if close else ""
        if not loc:
            where = f"{_CONFIG_VAR}={config_path}" if config_path else "settings"
            lines.append(f"{where}: {message}")
            continue
        field, rest = str(loc[0]), loc[1:]
        path = field + "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in rest)
        variable = env_name(field)
        from_env = variable in env_upper or any(key.startswith(variable + "__") for key in env_upper)
        if field in in_file and not from_env:
            lines.append(f"{config_path}: {path}: {message}")
            continue
        secret = any(word in path.lower() for word in _SECRET_WORDS)
        shown = f"={env_upper[variable]}" if variable in env_upper and not rest and not secret else ""
        lines.append(f"{variable}{path[len(field) :]}{shown}: {message}")
    return lines


def _fields_at(loc: Sequence[int | str]) -> list[str]:
    """The fields of the model that holds `loc`'s last part (`("bots", 0, "platfrom")`: a
    `BotConfig`'s), for the field an unknown key was meant to be."""
    model: type[BaseModel] = Settings
    for part in loc[:-1]:
        if isinstance(part, int):
            continue  # an item of a list: the same model as the list's
        field = model.model_fields.get(part)
        inner = _model_in(field.annotation) if field is not None else None
        if inner is None:
            return []
        model = inner
    return list(model.model_fields)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
