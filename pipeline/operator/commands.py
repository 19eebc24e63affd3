"""`switchboard deadletters` and `switchboard conversation`: the commands over the pure logic of
`letters` and `conversation`, with the worker's settings (environment and bots file)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from pipeline.errors import SwitchboardError
from pipeline.kafka import ConsumeTimeoutError
from pipeline.platforms import Platform, get_platform, known_platforms
from pipeline.records import conversation_key, now_ms
from pipeline.settings import Settings
from pipeline.state import State, close_redis_py, redis_py_client
from pipeline.topics import outbound_topic

from . import conversation as conv
from . import kafka
from .letters import (
    Letter,
    LetterFilter,
    Planned,
    ReplayContext,
    counts,
    parse_when,
    plan,
    render_table,
    summary,
    tally,
)

Out = Callable[[str], None]
LIST_COLUMNS = ["position", "at", "stage", "reason", "platform", "bot", "chat", "attempts", "error"]
PLAN_COLUMNS = ["position", "stage", "reason", "platform", "chat", "skip", "detail"]


class CommandError(SwitchboardError):
    """A command cannot do what was asked: one plain line for the terminal."""


def _print(line: str) -> None:
    print(line, flush=True)


def _platform_or_none(name: str) -> Platform | None:
    return get_platform(name) if name in known_platforms() else None


def letter_filter(args: argparse.Namespace, now: float) -> LetterFilter:
    try:
        since = parse_when(args.since, now) if args.since else None
        until = parse_when(args.until, now) if args.until else None
    except ValueError as exc:
        raise CommandError(f"--since/--until: {exc}") from None
    return LetterFilter(
        stages=frozenset(args.stage or ()),
        reasons=frozenset(args.reason or ()),
        platforms=frozenset(args.platform or ()),
        bots=frozenset(args.bot or ()),
        chats=frozenset(args.chat or ()),
        since_ms=since,
        until_ms=until,
    )


async def deadletters(args: argparse.Namespace, settings: Settings, out: Out = _print) -> int:
    try:
        return await _deadletters(args, settings, out)
    except ConsumeTimeoutError as exc:  # the topic is not there
        raise CommandError(f"{exc}: `switchboard topics apply` creates it") from None


async def _deadletters(args: argparse.Namespace, settings: Settings, out: Out) -> int:
    assert settings.kafka_bootstrap
    now = now_ms()
    wait = settings.kafka_fetch_max_wait_ms
    if args.action == "show":
        position = args.position if ":" in args.position else f"0:{args.position}"
        _total, found = await kafka.read_dead_letters(
            settings.kafka_bootstrap, lambda letter: letter.position == position, fetch_max_wait_ms=wait
        )
        if not found:
            raise CommandError(f"no dead letter at {position} (partition:offset; `deadletters list` shows them)")
        return _show(found[0], args, out)
    chosen = letter_filter(args, now)
    total, selected = await kafka.read_dead_letters(settings.kafka_bootstrap, chosen.matches, fetch_max_wait_ms=wait)
    if args.action == "list":
        return _list(total, selected, args, out)
    return await _replay(selected, chosen, args, settings, now, out)


def _list(total: int, selected: list[Letter], args: argparse.Namespace, out: Out) -> int:
    rows = [summary(letter, bodies=args.bodies) for letter in selected]
    shown = rows[-args.limit :] if args.limit else rows
    if args.json:
        out(
            json.dumps(
                {
                    "total": total,
                    "selected": len(selected),
                    "counts": [{"stage": s, "reason": r, "count": n} for s, r, n in counts(selected)],
                    "letters": shown,
                },
                ensure_ascii=False,
            )
        )
        return 0
    out(f"{len(selected)} of {total} dead letter(s) in im.deadletter match")
    for line in render_table(
        [{"stage": s, "reason": r, "count": n} for s, r, n in counts(selected)], ["stage", "reason", "count"]
    ):
        out(f"  {line}")
    if shown:
        if len(shown) < len(rows):
            out(f"the last {len(shown)} (--limit):")
        out("")
        for line in render_table(shown, LIST_COLUMNS):
            out(line)
        if args.bodies:
            for row in shown:
                out(f"{row['position']}: {row.get('record')}")
    return 0


def _show(found: Letter, args: argparse.Namespace, out: Out) -> int:
    row = summary(found, bodies=args.bodies, full_error=True)
    if args.json:
        out(json.dumps(row, ensure_ascii=False))
        return 0
    for name, value in row.items():
        if name in ("original", "record"):
            continue
        out(f"{name:<10} {'-' if value is None else value}")
    out("original   " + json.dumps(row["original"], ensure_ascii=False))
    if args.bodies:
        out("record     " + str(row["record"]))
    else:
        out("(the original record's text: --bodies)")
    return 0


async def _replay(
    selected: list[Letter],
    chosen: LetterFilter,
    args: argparse.Namespace,
    settings: Settings,
    now: float,
    out: Out,
) -> int:
    assert settings.kafka_bootstrap and settings.redis_url
    if args.rate <= 0:
        raise CommandError("--rate must be more than 0 records per second")
    context = ReplayContext(bot=settings.bot, platform=_platform_or_none, now_ms=now, named_reasons=chosen.reasons)
    # Dead letters that keep an excerpt: the whole original, from its topic while it still has it.
    for letter in selected:
        dead = letter.dead
        if dead is not None and dead.record_bytes is not None and dead.topic and dead.partition is not None:
            record = await kafka.read_record(
                settings.kafka_bootstrap,
                dead.topic,
                dead.partition,
                dead.offset or 0,
                fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            )
            if record is not None and record.value is not None:
                context.originals[letter.position] = record.value
    planned = await _skip_delivered(plan(selected, context), settings)
    todo = [p for p in planned if p.sendable]
    dry_run = not args.yes
    sent: list[kafka.Sent] = []
    if not dry_run and todo:
        progress = _progress_bar(sys.stderr) if not args.json else (lambda _d, _t: None)
        sent = await kafka.produce_replay(
            settings.kafka_bootstrap,
            todo,
            rate=args.rate,
            idempotence=settings.kafka_idempotence,
            progress=progress,
        )
    skipped = [p for p in planned if not p.sendable]
    if args.json:
        out(
            json.dumps(
                {
                    "dry_run": dry_run,
                    "selected": len(selected),
                    "tally": tally(planned),
                    # Sent (with where to), or in a dry run what would be.
                    "would_replay" if dry_run else "replayed": [
                        p.row() | ({"to": f"{s.planned.topic}[{s.partition}]@{s.offset}"} if s else {})
                        for p, s in _pair(todo, sent, dry_run)
                    ],
                    "skipped": [p.row() for p in skipped],
                },
                ensure_ascii=False,
            )
        )
        return 0
    verb = "would replay" if dry_run else "replayed"
    out(
        f"{len(selected)} dead letter(s) selected: {verb} {len(todo) if dry_run else len(sent)}, skipped {len(skipped)}"
    )
    for name, n in tally(planned).items():
        out(f"  {name:<18} {n}")
    if skipped:
        out("")
        out("skipped (not sent):")
        for line in render_table([p.row() for p in skipped], PLAN_COLUMNS):
            out(f"  {line}")
    if dry_run and todo:
        out("")
        for line in render_table([p.row() for p in todo], [*PLAN_COLUMNS[:-2], "topic"]):
            out(f"  {line}")
        out("")
        out(f"a dry run: nothing was sent. Run again with --yes to replay these {len(todo)} at {args.rate:g}/s.")
    return 0


def _pair(todo: list[Planned], sent: list[kafka.Sent], dry_run: bool) -> list[tuple[Planned, kafka.Sent | None]]:
    if dry_run:
        return [(p, None) for p in todo]
    return [(s.planned, s) for s in sent]


async def _skip_delivered(planned: list[Planned], settings: Settings) -> list[Planned]:
    """Egress records whose delivered marker is set went out already (a replay before this one, or
    a send that succeeded after all): reported, not produced again. Egress would drop them anyway."""
    marked = [p for p in planned if p.sendable and p.delivered_marker is not None]
    if not marked:
        return planned
    assert settings.redis_url
    state = _state(settings)
    try:
        keys = [
            state.keys.marker("out", ident, scope)
            for scope, ident in (p.delivered_marker for p in marked if p.delivered_marker)
        ]
        found = await state.redis.pipeline([("EXISTS", key) for key in keys])
    finally:
        await state.redis.aclose()
    delivered = {id(p) for p, hit in zip(marked, found, strict=True) if int(hit)}
    return [
        p.skipped("already_delivered", "egress's marker says it was delivered") if id(p) in delivered else p
        for p in planned
    ]


def _state(settings: Settings) -> State:
    assert settings.redis_url
    return State.connect(
        settings.redis_url,
        settings.redis_prefix,
        mapping_ttl=settings.mapping_ttl_seconds,
        dedup_ttl=settings.dedup_ttl_seconds,
    )


def _progress_bar(stream: Any) -> Callable[[int, int], None]:
    """`replayed n/total` on one line of a terminal (a line per tenth elsewhere)."""
    tty = bool(getattr(stream, "isatty", lambda: False)())

    def show(done: int, total: int) -> None:
        width = 30
        filled = width * done // total
        line = f"replayed {done}/{total} [{'#' * filled}{'.' * (width - filled)}]"
        if tty:
            stream.write("\r" + line + ("\n" if done == total else ""))
            stream.flush()
        elif done == total or done % max(1, total // 10) == 0:
            stream.write(line + "\n")
            stream.flush()

    return show


# -- conversation --------------------------------------------------------------------------------------


async def conversation(args: argparse.Namespace, settings: Settings, out: Out = _print) -> int:
    assert settings.kafka_bootstrap and settings.redis_url
    state = _state(settings)
    try:
        if args.session:
            redis = redis_py_client(settings.redis_url)
            try:
                key = await conv.conversation_of_session(state, redis, settings.partitions, args.session)
            finally:
                await close_redis_py(redis)
            if key is None:
                raise CommandError(f"no conversation is mapped to session {args.session!r}")
        else:
            if not (args.platform and args.bot and args.chat):
                raise CommandError(
                    "give --platform, --bot and --chat (and --user for one session per user), or --session"
                )
            key = conversation_key(args.platform, args.bot, args.chat, args.user)
        stored = await conv.read_state(state, key, settings.partitions)
        platform_name = key.split(":", 1)[0]
        records = await kafka.last_records_of_key(
            settings.kafka_bootstrap,
            outbound_topic(platform_name),
            key,
            count=conv.LAST_REPLIES,
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        )
        parsed = [(r, conv.parse_outbound(r.value)) for r in records]
        messages = [m for _, m in parsed if m is not None]
        flags = iter(await conv.delivered_flags(state, _platform_or_none(platform_name), messages))
        outbound = [
            conv.OutboundSeen(r.partition, r.offset, r.timestamp, m, next(flags)) for r, m in parsed if m is not None
        ]
    finally:
        await state.redis.aclose()
    report = conv.describe(key, stored, outbound, bodies=args.bodies)
    if args.json:
        out(json.dumps(report, ensure_ascii=False))
    else:
        for line in conv.render_text(report):
            out(line)
    return 0
