"""The key layout: every key is `<prefix><kind>:<id>`, one kind per thing kept.

Ids in keys are conversation keys, session ids, event ids and turn ids. A conversation key encodes
its own ids (`pipeline.records.conversation_key`), so no two conversations share a key; the other
ids are the session server's or Switchboard's own (`stable_id`), neither of which contains `:`.

On a Redis Cluster (`cluster=True`) a key that a script or transaction touches together with others
carries its scope as a hash tag, `<prefix><kind>:{<scope>}<id>`: every key of one conversation (its
hash, lists, turn records, markers, in-flight entry) hashes to the conversation's slot, every key of
one bot's connection or deliveries (leases, fencing token, offset, delivered markers, rate windows)
to the bot's, every key of one console chat to the chat's. So each script runs on one node. The
scope is percent-encoded (`%`, `{`, `}`) so the tag is never empty nor cut short. On one server the
layout is the one it always was: the same ids, the same keys, so an upgrade keeps every marker.
"""

from __future__ import annotations

from dataclasses import dataclass


def _tag(scope: str) -> str:
    return "{" + scope.replace("%", "%25").replace("{", "%7B").replace("}", "%7D") + "}"


@dataclass(frozen=True)
class Keys:
    prefix: str
    cluster: bool = False

    def __post_init__(self) -> None:
        if self.cluster and ("{" in self.prefix or "}" in self.prefix):
            raise ValueError("the Redis key prefix may not contain '{' or '}' on a Redis Cluster (hash tags)")

    def of(self, kind: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{ident}"

    def scoped(self, kind: str, scope: str, ident: str | None = None) -> str:
        """A key of `scope` (a conversation, a bot, a chat): `kind:<ident>` on one server (`ident`
        defaults to the scope itself), `kind:{<scope>}<ident>` on a cluster."""
        if not self.cluster:
            return self.of(kind, scope if ident is None else ident)
        return self.of(kind, _tag(scope) + (ident or ""))

    def absent(self, scope: str) -> str:
        """The key a script is given for "no such key": `''`, or on a cluster the bare tag (every
        declared key must hash to the script's slot). Scripts test it with `given()`."""
        return _tag(scope) if self.cluster else ""

    # Conversations.
    def conversation(self, conversation: str) -> str:
        """Hash: status, session_id, turn, last_message, pending, tools, interrupted, held, cursor."""
        return self.scoped("conv", conversation)

    def session_of(self, conversation: str) -> str:
        return self.scoped("c2s", conversation)

    def held(self, conversation: str) -> str:
        """List: commands held while the session is busy (`<turn id>\\n<command JSON>`)."""
        return self.scoped("held", conversation)

    def turns(self, conversation: str) -> str:
        """List: ids of the user turns sent to the session and not yet ended, oldest first."""
        return self.scoped("turns", conversation)

    def turn(self, turn_id: str, conversation: str) -> str:
        """A sent turn's record (what render needs to answer it)."""
        return self.scoped("turn", conversation, turn_id)

    def turn_prefix(self, conversation: str) -> str:
        """What a turn id is appended to for its record's key (a script builds it)."""
        return self.turn("", conversation)

    def window(self, conversation: str) -> str:
        """List: the group-context window, newest first."""
        return self.scoped("ctx", conversation)

    def reply_deadlines(self) -> str:
        """Sorted set: `<turn id> <conversation>` → when the turn's reply-window notice is due (ms)."""
        return self.of("reply-deadlines", "turns")

    # Streams.
    def inflight(self, partition: int, conversation: str) -> str:
        """Hash session id → the stream a worker must hold: one per partition of session.input on
        one server; on a cluster one per conversation and partition (in the conversation's slot,
        found through `inflight_index`)."""
        return (
            self.scoped("inflight", conversation, str(partition))
            if self.cluster
            else self.partition_inflight(partition)
        )

    def partition_inflight(self, partition: int) -> str:
        return self.of("inflight", str(partition))

    def inflight_index(self, partition: int) -> str:
        """Cluster only. Set: the conversations that may have a stream in flight on `partition` (a
        superset: written before the stream starts, pruned when read)."""
        return self.of("inflight-index", str(partition))

    # Markers.
    def marker(self, kind: str, ident: str, scope: str) -> str:
        """A de-duplication marker of `scope`: the conversation for `in`, `sent`, `turnbind` and
        `turnend`; the bot (`platform:bot`) for `out`."""
        return self.scoped(f"dedup:{kind}", scope, ident)

    # Deliveries.
    def rate_window(self, identifier: str, scope: str) -> str:
        """A sliding rate window; `scope` the bot, whose windows (per chat, per bot) a delivery
        takes together."""
        return self.scoped("rate", scope, identifier)

    # Long connections (platform and bot ids contain no `:`: see `BotConfig.bot_id`).
    def lease(self, platform: str, bot_id: str, channel: str) -> str:
        """String `holder|token|state`, expiring: which worker holds the bot's connection channel."""
        return self.scoped("lease", f"{platform}:{bot_id}", f"{platform}:{bot_id}:{channel}")

    def lease_token(self, platform: str, bot_id: str) -> str:
        """Counter: the bot's fencing token, one more for every new holder."""
        return self.scoped("lease-token", f"{platform}:{bot_id}")

    def actions(self, platform: str, bot_id: str) -> str:
        """List: actions for the bot's holder to run over its connection, from any worker."""
        return self.scoped("actions", f"{platform}:{bot_id}")

    def action_reply(self, reply_id: str) -> str:
        """List: the holder's answer to one action request (its sender waits on it)."""
        return self.of("action-reply", reply_id)

    def action_done(self, platform: str, bot_id: str, request_id: str) -> str:
        """An action's record: `sending:<holder|token>` while it is sent, then `done:<answer>`, so an
        action asked for again is answered, not sent twice."""
        return self.scoped("action-done", f"{platform}:{bot_id}", request_id)

    def offset(self, platform: str, bot_id: str) -> str:
        """The committed position of a polled bot's update stream (Telegram: the next `offset` of
        `getUpdates`), written only by the holder of its lease."""
        return self.scoped("offset", f"{platform}:{bot_id}")

    def resume(self, platform: str, bot_id: str) -> str:
        """What a new connection needs to resume a bot's session where the last one left off
        (Discord: the session id, its resume URL and the last durable sequence number), written only
        by the holder of its lease."""
        return self.scoped("resume", f"{platform}:{bot_id}")
