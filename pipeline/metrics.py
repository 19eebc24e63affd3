"""The Prometheus metric catalogue (docs/operations.md, "Metrics").

Labels are bounded: platform, bot, stage, outcome, reason, type. Never chat or user ids.
"""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.metrics import MetricWrapperBase

# No `*_created` series: one more sample per label set of every counter and histogram (the time it
# was first seen), which nothing here reads and Prometheus stores as a gauge (docs/operations.md).
disable_created_metrics()

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)

# Ingress and ingest.
WEBHOOKS = Counter("switchboard_webhooks_total", "Webhook requests by outcome", ["platform", "outcome"])
INBOUND_ACCEPTED = Counter("switchboard_inbound_accepted_total", "Inbound messages produced", ["platform"])
INBOUND_DROPPED = Counter("switchboard_inbound_dropped_total", "Inbound messages dropped", ["platform", "reason"])
INBOUND_DEDUPLICATED = Counter(
    "switchboard_inbound_deduplicated_total", "Inbound messages dropped as duplicates", ["platform"]
)
INBOUND_FILTERED = Counter(
    "switchboard_inbound_filtered_total", "Group messages that did not trigger the agent", ["platform"]
)
TURNS_TRIGGERED = Counter("switchboard_turns_triggered_total", "Messages that trigger a turn", ["platform", "reason"])
CHAT_COMMANDS = Counter("switchboard_chat_commands_total", "Chat commands handled", ["platform", "command"])

# Controls (docs/controls.md). Bot ids are configuration, not user ids: a bounded label.
RATE_LIMITED = Counter(
    "switchboard_rate_limited_total",
    "Messages over an inbound rate limit: no turn (scope user, chat, bot), or not kept as context (scope context)",
    ["platform", "bot", "scope", "outcome"],
)  # scope: user | chat | bot (turns; outcome noticed: the window's one notice, limited: nothing said)
# | context (a group message past its message limit, outcome unkept: not kept as context)
MODERATION = Counter(
    "switchboard_moderation_total", "Moderation decisions", ["platform", "bot", "direction", "outcome", "reason"]
)  # direction: inbound | outbound; outcome: allowed | dropped | noticed | blocked | redacted
# reason: list | hook | hook_failed
OVERLOADED = Counter(
    "switchboard_overloaded_total",
    "Messages whose turn had not started within the bot's bound: the notice `overloaded` instead",
    ["platform", "bot"],
)

# Web server and console.
WEB_CONNECTIONS_OPEN = Gauge("switchboard_web_connections_open", "Open connections to this worker's web server")
WEB_CONNECTIONS_CLOSED = Counter(
    "switchboard_web_connections_closed_total", "Connections closed by the web server's limits", ["reason"]
)  # idle_timeout | header_timeout | body_timeout | evicted | over_limit
WEB_DEADLINES_DEFERRED = Counter(
    "switchboard_web_deadlines_deferred_total",
    "Checks of the connections' request deadlines put off because the event loop was held up",
)
WEB_REJECTED = Counter(
    "switchboard_web_rejected_total", "Console and metrics requests refused", ["surface", "reason"]
)  # surface: console | metrics | http (aiohttp refused a malformed request: bad_request)
# reason: unauthorized | bad_request | over_viewer_limit | unavailable
CONSOLE_VIEWERS = Gauge("switchboard_console_viewers", "Open console streams on this worker")
CONSOLE_STREAMS_ENDED = Counter(
    "switchboard_console_streams_ended_total", "Console streams ended", ["reason"]
)  # client_left | slow | resync | shutdown

# Dispatch and sessions.
TURNS_STARTED = Counter("switchboard_turns_started_total", "User turns sent to a session", ["platform", "policy"])
MESSAGES_HELD = Counter(
    "switchboard_messages_held_total", "Messages held while the session was busy", ["platform", "policy"]
)
MESSAGES_MERGED = Counter(
    "switchboard_messages_merged_total",
    "Messages sent in one user turn with others (busy policy merge): merged by ingest (a chat's triggers of one"
    " batch, one record) or by dispatch (held messages released together)",
    ["platform", "where"],
)
SESSIONS_CREATED = Counter("switchboard_sessions_created_total", "Sessions created", ["platform"])
SESSION_CALLS = Counter("switchboard_session_calls_total", "Session API calls by outcome", ["call", "outcome"])
TURNS_FINISHED = Counter(
    "switchboard_turns_finished_total", "Turns finished, by stop reason", ["platform", "stop_reason"]
)
UNATTRIBUTED_TURN_ENDS = Counter(
    "switchboard_unattributed_turn_ends_total", "Idles that end no turn in flight (a failed send ran after all)"
)
SESSION_ERRORS = Counter("switchboard_session_errors_total", "session.error events", ["error_type", "retry_status"])
TOKENS = Counter("switchboard_session_tokens_total", "Tokens reported by span.model_request_end", ["kind"])
ACTIVE_SECONDS = Counter("switchboard_session_active_seconds_total", "Active seconds from session.usage deltas")
CUSTOM_TOOLS = Counter("switchboard_custom_tool_calls_total", "agent.custom_tool_use answered", ["tool", "outcome"])

# Usage budgets (`pipeline.controls`): per bot, never per chat or user.
BUDGET_TOKENS = Counter(
    "switchboard_budget_tokens_total", "Tokens accounted against usage budgets (session.usage)", ["platform", "bot"]
)
BUDGET_ACTIVE_SECONDS = Counter(
    "switchboard_budget_active_seconds_total", "Active seconds accounted against usage budgets", ["platform", "bot"]
)
BUDGET_WINDOW_TOKENS = Gauge(
    "switchboard_budget_window_tokens", "The bot's tokens in its current budget window", ["platform", "bot"]
)
BUDGET_REFUSED = Counter(
    "switchboard_budget_refused_total",
    "Messages that started no turn: a usage budget spent",
    ["platform", "bot", "scope"],
)  # scope: chat | user | bot

# Session streams.
STREAMS_OPEN = Gauge("switchboard_sse_streams_open", "Session streams held by this worker")
STREAM_RECONNECTS = Counter("switchboard_sse_reconnects_total", "Session stream reconnects")
STREAM_EVENTS = Counter("switchboard_session_events_total", "Server events produced to session.events", ["type"])

# Render.
SEGMENTS = Counter(
    "switchboard_segments_total", "Final replies by validation outcome", ["platform", "outcome"]
)  # valid | corrected | failed | empty
LEAK_HITS = Counter(
    "switchboard_leak_hits_total", "Secrets found in outbound messages", ["platform", "kind"]
)  # kind: reply | progress | notice | confirmation
MEDIA_REJECTED = Counter(
    "switchboard_media_rejected_total", "Media replaced by a notice", ["platform", "reason"]
)  # reason: pipeline.segments.media.REJECTION_REASONS
# Dispatch: inbound media a platform holds (a WhatsApp media id), read for the session.
INBOUND_MEDIA = Counter(
    "switchboard_inbound_media_total", "Inbound media read for the session, by outcome", ["platform", "outcome"]
)  # outcome: read, unsupported_by_session, or a pipeline.segments.media.REJECTION_REASONS label
UNKNOWN_MENTIONS = Counter("switchboard_unknown_mentions_total", "Mentions of ids unknown to the turn", ["platform"])
NOTICES = Counter("switchboard_notices_total", "Host-written notices sent", ["platform", "notice"])

# Egress.
EGRESS = Counter(
    "switchboard_egress_total", "Outbound deliveries by outcome", ["platform", "outcome"]
)  # sent | duplicate | retried | rate_limited | dead_lettered
HANDLER_RETRIES = Counter(
    "switchboard_handler_retries_total", "Stage handler retries while Redis was unavailable", ["stage", "error"]
)
DEAD_LETTERS = Counter("switchboard_dead_letters_total", "Records dead-lettered", ["stage", "reason"])
# Records `switchboard deadletters replay` put back (`hops["replay"]`), as each stage reads them.
REPLAYED_RECORDS = Counter("switchboard_replayed_records_total", "Replayed dead letters read by a stage", ["stage"])

# Latency.
END_TO_END = Histogram(
    "switchboard_end_to_end_seconds", "Webhook received → reply delivered", ["platform"], buckets=_LATENCY_BUCKETS
)
PIPELINE_OVERHEAD = Histogram(
    "switchboard_pipeline_overhead_seconds",
    "End-to-end minus the agent's time",
    ["platform"],
    buckets=_LATENCY_BUCKETS,
)
STAGE_LATENCY = Histogram(
    "switchboard_stage_latency_seconds", "Time from the previous hop to this stage", ["stage"], buckets=_LATENCY_BUCKETS
)

# Keyed executors.
EXECUTOR_IN_FLIGHT = Gauge("switchboard_executor_in_flight", "Calls in flight", ["stage"])
EXECUTOR_PENDING = Gauge("switchboard_executor_pending", "Accepted, not yet acknowledged messages", ["stage"])

# Redis.
REDIS_ROUND_TRIPS = Counter(
    "switchboard_redis_round_trips", "Requests sent to Redis (a command, a pipeline or a script call each)"
)

REDIS_UNREPLICATED = Counter(
    "switchboard_redis_unreplicated_writes",
    "Delivery and send markers no replica confirmed within SWITCHBOARD_REDIS_REPLICA_WAIT_MS",
)

# Consumer lag (exported by the worker; Faust does not derive it).
PARTITIONS_ASSIGNED = Gauge(
    "switchboard_partitions_assigned", "Topic partitions this worker consumes now (0 during a rebalance)"
)
EVENT_LOOP_LAG = Histogram(
    "switchboard_event_loop_lag_seconds",
    "How late a 100 ms timer of the worker's event loop fired: time the loop was held by other work",
    # From half a millisecond: what every ready callback waits under load (the bench's mean lag).
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
WORKER_IDLE = Gauge(
    "switchboard_worker_idle",
    "1 when nothing is in flight here: no unread records in this worker's partitions, no pending work, no turn",
)
EVENT_LOOP_STALLS = Counter("switchboard_event_loop_stalls_total", "Times the event loop was held for 1 s or more")
GC_FULL_COLLECTION = Histogram(
    "switchboard_gc_full_collection_seconds",
    "The worker's timed full collections of cyclic garbage: how long each held the event loop",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
CONSUMER_LAG = Gauge("switchboard_consumer_lag", "High watermark minus committed offset", ["topic", "partition"])
COMMITS_HELD = Counter(
    "switchboard_commits_held_total",
    "Offset commits held back because the record at the committed offset was never acknowledged; "
    "the partition is read again from there",
    ["topic"],
)

# Long connections (`pipeline.connections`). Bot ids are configuration, not user ids: a bounded label.
CONNECTIONS_HELD = Gauge(
    "switchboard_connections_held", "Long connections this worker holds", ["platform", "transport"]
)
CONNECTION_RECONNECTS = Counter(
    "switchboard_connection_reconnects_total",
    "Long connections made again by their holder (a dial after a drop or a failure; an accepted one "
    "replacing an earlier one on this worker)",
    ["platform", "transport"],
)
CONNECTION_HOLDER_CHANGES = Counter(
    "switchboard_connection_holder_changes_total",
    "Leases of a bot's connection taken by this worker",
    ["platform", "bot"],
)
CONNECTION_HOLDER_MISSING = Gauge(
    "switchboard_connection_holder_missing",
    "1 while no worker holds a live connection of the bot (from the leases in Redis; every worker exports it)",
    ["platform", "bot"],
)
CONNECTION_HANDSHAKES = Counter(
    "switchboard_connection_handshakes_total", "Connections dialed or accepted, and refused", ["platform", "outcome"]
)  # dialed | dial_failed | accepted | missing_token | bad_token | bad_role | self_id_mismatch | not_a_connection_bot
# | bad_header | bad_query | bad_expect (a OneBot handshake refused before its token is checked)
CONNECTION_REPLACEMENTS = Counter(
    "switchboard_connection_replacements_total",
    "Accepted connections that found the bot's connection held: replaced it (the newest wins), or refused",
    ["platform", "bot", "outcome"],
)  # replaced | refused_partial (a one-role socket would have replaced a universal one)
CONNECTION_FRAMES = Counter(
    "switchboard_connection_frames_total", "Inbound frames of held connections by outcome", ["platform", "outcome"]
)  # produced | heartbeat | meta | the parser's ignored and rejection reasons | produce_failed | …
CONNECTION_ACTIONS = Counter(
    "switchboard_connection_actions_total", "Actions over held connections by outcome", ["platform", "outcome"]
)  # sender: answered | no_holder | timeout
# holder: run | repeated | joined | outcome_unknown | fenced | expired | malformed
CONNECTION_POLL_ERRORS = Counter(
    "switchboard_connection_poll_errors_total",
    "Polls of a polled transport (Telegram getUpdates) that failed, by reason",
    ["platform", "bot", "reason"],
)  # conflict | webhook_active | unauthorized | rate_limited | server_error | network | bad_request | bad_response


_M = TypeVar("_M", bound=MetricWrapperBase)
_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: _M, *labels: str) -> _M:
    """`metric.labels(*labels)`, remembered: prometheus-client validates the values and takes a
    lock on every `labels()` call, a few microseconds that count on paths run per record. Only for
    metrics whose children are never removed (`CONSUMER_LAG` is)."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


def observe_hop(stage: str, hops: dict[str, float], previous: str, now: float) -> None:
    start = hops.get(previous)
    # A replayed record's hops are those of its first attempt: not this stage's latency.
    if start is not None and "replay" not in hops:
        child(STAGE_LATENCY, stage).observe(max(0.0, (now - start) / 1000.0))
