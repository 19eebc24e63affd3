"""The key layout: every key is `<prefix><kind>:<id>`, one kind per thing kept.

Ids in keys are conversation keys, session ids, event ids and turn ids. A conversation key encodes
its own ids (`pipeline.records.conversation_key`), so no two conversations share a key; the other
ids are the session server's or Switchboard's own (`stable_id`), neither of which contains `:`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def of(self, kind: str, ident: str) -> str:
        return f"{self.prefix}{kind}:{ident}"

    # Conversations.
    def conversation(self, conversation: str) -> str:
        """Hash: status, session_id, turn, last_message, pending, tools, interrupted, held, cursor."""
        return self.of("conv", conversation)

    def session_of(self, conversation: str) -> str:
        return self.of("c2s", conversation)

    def conversation_of(self, session_id: str) -> str:
        return self.of("s2c", session_id)

    def held(self, conversation: str) -> str:
        """List: commands held while the session is busy (`<turn id>\\n<command JSON>`)."""
        return self.of("held", conversation)

    def turns(self, conversation: str) -> str:
        """List: ids of the user turns sent to the session and not yet ended, oldest first."""
        return self.of("turns", conversation)

    def turn(self, turn_id: str) -> str:
        """A sent turn's record (what render needs to answer it)."""
        return self.of("turn", turn_id)

    def turn_prefix(self) -> str:
        return self.of("turn", "")

    def window(self, conversation: str) -> str:
        """List: the group-context window, newest first."""
        return self.of("ctx", conversation)

    def reply_deadlines(self) -> str:
        """Sorted set: `<turn id> <conversation>` → when the turn's reply-window notice is due (ms)."""
        return self.of("reply-deadlines", "turns")

    # Streams.
    def inflight(self, partition: int) -> str:
        """Hash per partition of session.input: session id → the stream a worker must hold."""
        return self.of("inflight", str(partition))

    # Markers.
    def marker(self, kind: str, ident: str) -> str:
        return self.of(f"dedup:{kind}", ident)

    # Deliveries.
    def rate_window(self, identifier: str) -> str:
        return self.of("rate", identifier)

    # Long connections (platform and bot ids contain no `:`: see `BotConfig.bot_id`).
    def lease(self, platform: str, bot_id: str, channel: str) -> str:
        """String `holder|token|state`, expiring: which worker holds the bot's connection channel."""
        return self.of("lease", f"{platform}:{bot_id}:{channel}")

    def lease_token(self, platform: str, bot_id: str) -> str:
        """Counter: the bot's fencing token, one more for every new holder."""
        return self.of("lease-token", f"{platform}:{bot_id}")

    def actions(self, platform: str, bot_id: str) -> str:
        """List: actions for the bot's holder to run over its connection, from any worker."""
        return self.of("actions", f"{platform}:{bot_id}")

    def action_reply(self, reply_id: str) -> str:
        """List: the holder's answer to one action request (its sender waits on it)."""
        return self.of("action-reply", reply_id)

    def action_done(self, request_id: str) -> str:
        """An action's record: `sending:<holder|token>` while it is sent, then `done:<answer>`, so an
        action asked for again is answered, not sent twice."""
        return self.of("action-done", request_id)

    def offset(self, platform: str, bot_id: str) -> str:
        """The committed position of a polled bot's update stream (Telegram: the next `offset` of
        `getUpdates`), written only by the holder of its lease."""
        return self.of("offset", f"{platform}:{bot_id}")

    def resume(self, platform: str, bot_id: str) -> str:
        """What a new connection needs to resume a bot's session where the last one left off
        (Discord: the session id, its resume URL and the last durable sequence number), written only
        by the holder of its lease."""
        return self.of("resume", f"{platform}:{bot_id}")
