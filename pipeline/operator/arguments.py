"""The operator commands' arguments (argparse only: `switchboard --help` imports nothing else)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_parsers(add_parser: Callable[..., argparse.ArgumentParser]) -> None:
    """`deadletters` and `conversation` (`add_parser`: the subparsers' `add_parser`)."""
    dead = add_parser(
        "deadletters",
        help="list, show or replay the dead letters (im.deadletter)",
        description=(
            "Read im.deadletter without a consumer group (nothing committed) with the worker's settings. "
            "list: a count per stage and reason, then the records (no message bodies unless --bodies). "
            "show POSITION: one record. replay: the selected records back to their original topic, a dry "
            "run unless --yes; records past their platform's reply window, or delivered already, are "
            "reported and not sent."
        ),
    )
    dead.add_argument("action", choices=["list", "show", "replay"], metavar="ACTION", help="list, show or replay")
    dead.add_argument("position", nargs="?", default=None, help="show: the record, partition:offset (or offset)")
    for name, what in (("stage", "stage"), ("reason", "reason"), ("platform", "platform"), ("bot", "bot id")):
        dead.add_argument(f"--{name}", action="append", metavar=name.upper(), help=f"only this {what} (repeatable)")
    dead.add_argument("--chat", action="append", metavar="CHAT", help="only this chat id (repeatable)")
    dead.add_argument(
        "--since", metavar="WHEN", help="only dead letters from WHEN on: 30m, 2h, 7d or an ISO time (UTC)"
    )
    dead.add_argument("--until", metavar="WHEN", help="only dead letters before WHEN")
    dead.add_argument("--bodies", action="store_true", help="also print the original records (message bodies)")
    dead.add_argument("--limit", type=int, default=50, help="list: show the last N records (0: all; default 50)")
    dead.add_argument("--yes", action="store_true", help="replay: send (without it, a dry run)")
    dead.add_argument(
        "--rate", type=float, default=5.0, metavar="PER_SECOND", help="replay: records per second at most (default 5)"
    )
    dead.add_argument("--json", action="store_true", help="one JSON document on stdout, for scripts")
    conversation = add_parser(
        "conversation",
        help="look up one conversation: its session, turn in flight, held messages, last replies",
        description=(
            "What Switchboard keeps of one conversation, by platform, bot and chat id or by session id: "
            "the mapped session, the turns in flight, held messages, the session stream's cursor and the "
            "last replies given to egress, each with whether it was delivered. Reads only."
        ),
    )
    conversation.add_argument("--platform", help="the platform, e.g. telegram")
    conversation.add_argument("--bot", help="the bot id of the bots file")
    conversation.add_argument("--chat", help="the chat id, as in the conversation key")
    conversation.add_argument("--user", help="the user id, for a conversation with one session per user in a group")
    conversation.add_argument("--session", help="or: the session id (found back to its conversation)")
    conversation.add_argument("--bodies", action="store_true", help="also print message texts")
    conversation.add_argument("--json", action="store_true", help="one JSON document on stdout, for scripts")
