"""Cost of the reply contract per turn: validation vs jsonschema, finalize_reply without media, and
the leak check on its own.

Usage: .venv/bin/python bench/segments_bench.py [--rounds N]

Each corpus text (tests/segments/corpus/replies.jsonl) is timed individually, `rounds` times; the
figures are the median and p99 of all those per-call timings, in microseconds. "typical" excludes
the deliberately oversized texts (> 8 KiB). jsonschema is given every advantage: the validator is
built once, and its cost is `json.loads` + `is_valid` (no error collection).

The leak figures use a deployment-sized secret set (`DEPLOYMENT_SECRETS`: four bots' credentials
plus the service keys, 24 values) as well as the corpus's one configured secret: the check runs on
every outbound message, so its cost with every secret of the deployment is the one that matters.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from jsonschema import Draft202012Validator

from pipeline.segments import (
    Capabilities,
    LeakScanner,
    Member,
    RepliedMessage,
    Reply,
    ReplyInvalid,
    ReplyPolicy,
    TurnContext,
    finalize_reply,
    reply_json_schema,
    validate_reply,
)
from pipeline.segments.leaks import scan_segments

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "segments" / "corpus" / "replies.jsonl"
TYPICAL_MAX_CHARS = 8 * 1024


def _deployment_secrets() -> list[str]:
    # Shapes of real credentials (random, fixed): 4 bots x 3-4 credentials + 8 service values.
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits

    def token(n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    return [
        f"{rng.randrange(10**9)}:AA{token(33)}",  # telegram token
        token(32),  # telegram webhook secret
        "ob-" + token(20),  # onebot secret
        token(24),  # onebot access token
        "cli_" + token(16),  # lark app id
        token(32),  # lark app secret
        token(32),  # lark verification token
        token(24),  # lark encrypt key
        token(32),  # slack signing secret
        "xoxb-" + token(50),  # slack bot token
        token(40),  # console token
        token(36),  # console token (second bot)
        token(36),  # session api key
        token(36),  # correction api key
        "AKLT" + token(40),  # ark access key
        token(60),  # ark secret key
        token(24),  # redis password
        token(24),  # kafka password
        token(28),
        token(28),
        token(30),
        token(30),
        token(44),
        token(44),
    ]


DEPLOYMENT_SECRETS = _deployment_secrets()


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def summary(name: str, samples_ns: list[int]) -> str:
    us = [s / 1000 for s in samples_ns]
    return f"{name:<44} median {statistics.median(us):8.1f} µs   p99 {percentile(us, 0.99):9.1f} µs   n={len(us)}"


def time_each(texts: list[str], call: Callable[[str], Any], rounds: int) -> list[int]:
    timings: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        for text in texts:
            start = clock()
            call(text)
            timings.append(clock() - start)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()

    cases = [json.loads(line) for line in CORPUS.open(encoding="utf-8") if line.strip()]
    texts = [case["text"] for case in cases]
    typical = [t for t in texts if len(t) <= TYPICAL_MAX_CHARS]
    validator = Draft202012Validator(reply_json_schema())

    def pydantic_validate(text: str) -> bool:
        try:
            validate_reply(text)
            return True
        except ReplyInvalid:
            return False

    def jsonschema_validate(text: str) -> bool:
        try:
            return bool(validator.is_valid(json.loads(text)))
        except ValueError:
            return False

    # Same verdicts, or the comparison means nothing. Expected exceptions: plain `json.loads` accepts
    # NaN, Infinity, 1e400 (→ inf), lone surrogates and duplicate keys (keeping the last), which the
    # contract refuses (the tests compare with a strict RFC 8259 loader and find no disagreement).
    disagreements = [c["name"] for c in cases if pydantic_validate(c["text"]) != jsonschema_validate(c["text"])]

    turn = TurnContext(
        bot_id="bench",
        platform="onebot",
        chat_type="group",
        sender_id="10001",
        sender_name="Alice",
        replied_to=RepliedMessage("m-1", "10004"),
        context_members=(Member("10002"), Member("10003")),
        looked_up_member_ids=frozenset({"10005"}),
        bot_self_ids=frozenset({"90000"}),
    )
    policy = ReplyPolicy(leak_scanner=LeakScanner(["corpus-configured-secret-0001"]))
    capabilities = Capabilities()

    async def finalize_all(batch: list[str], rounds: int, with_policy: ReplyPolicy = policy) -> list[int]:
        timings: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(rounds):
            for text in batch:
                start = clock()
                await finalize_reply(text, turn, with_policy, corrector=None, media=None, capabilities=capabilities)
                timings.append(clock() - start)
        return timings

    deployment_scanner = LeakScanner([*DEPLOYMENT_SECRETS, "corpus-configured-secret-0001"])
    deployment_policy = ReplyPolicy(leak_scanner=deployment_scanner)
    valid_segments = []
    for text in texts:
        try:
            valid_segments.append(list(Reply.model_validate_json(text).segments))
        except ValueError:
            continue
    typical_segments = [s for s in valid_segments if len(json.dumps([x.model_dump() for x in s])) <= TYPICAL_MAX_CHARS]

    def scan_each(batch: list[list[Any]], scanner: LeakScanner, rounds: int) -> list[int]:
        timings: list[int] = []
        clock = time.perf_counter_ns
        for _ in range(rounds):
            for segments in batch:
                start = clock()
                scan_segments(segments, scanner)
                timings.append(clock() - start)
        return timings

    # Warm-up (imports, caches, schema build).
    time_each(texts, pydantic_validate, 2)
    time_each(texts, jsonschema_validate, 1)

    print(f"corpus: {len(texts)} texts ({len(typical)} typical ≤ {TYPICAL_MAX_CHARS} chars), {args.rounds} rounds")
    print(
        f"verdicts differing from plain json.loads+jsonschema ({len(disagreements)}, all cases json.loads "
        f"is lax about): {', '.join(disagreements)}"
    )
    print(summary("validate_reply (pydantic, all)", time_each(texts, pydantic_validate, args.rounds)))
    print(summary("validate_reply (pydantic, typical)", time_each(typical, pydantic_validate, args.rounds)))
    js_rounds = max(1, args.rounds // 5)
    print(summary("json.loads + jsonschema (all)", time_each(texts, jsonschema_validate, js_rounds)))
    print(summary("json.loads + jsonschema (typical)", time_each(typical, jsonschema_validate, js_rounds)))
    print(summary("finalize_reply, no media (all)", asyncio.run(finalize_all(texts, args.rounds))))
    print(summary("finalize_reply, no media (typical)", asyncio.run(finalize_all(typical, args.rounds))))
    print(
        summary(
            "finalize_reply, 25 secrets (typical)", asyncio.run(finalize_all(typical, args.rounds, deployment_policy))
        )
    )
    scan_each(valid_segments, deployment_scanner, 1)
    print(f"leak check on valid replies: {len(valid_segments)} ({len(typical_segments)} typical)")
    print(summary("leak check, 1 secret (typical)", scan_each(typical_segments, policy.leak_scanner, args.rounds)))
    print(summary("leak check, 25 secrets (typical)", scan_each(typical_segments, deployment_scanner, args.rounds)))
    print(summary("leak check, 25 secrets (all)", scan_each(valid_segments, deployment_scanner, args.rounds)))


if __name__ == "__main__":
    main()
