# ruff: noqa: RUF001  (Chinese sample text uses full-width punctuation on purpose)
"""Writes `replies.jsonl`: the reply corpus with the expected outcome of each text.

Run `python -m tests.segments.corpus.build_corpus` after changing it; the JSONL is what the tests read
(it is checked in so a reviewer can read the cases without running anything). Expectations are
written here by hand per case, not computed by the code under test.

Turn context used by the tests (see `test_corpus.py`): sender 10001, group members 10002 and 10003,
replied-to author 10004, looked-up member 10005, bot self id 90000; configured secret
`corpus-configured-secret-0001`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("replies.jsonl")
CONFIGURED_SECRET = "corpus-configured-secret-0001"

cases: list[dict[str, Any]] = []


def add(name: str, text: str, expect: str, **extra: Any) -> None:
    cases.append({"name": name, "text": text, "expect": expect, **extra})


def reply(*segments: dict[str, Any], **dump: Any) -> str:
    return json.dumps({"segments": list(segments)}, **dump)


def seg(kind: str, **data: Any) -> dict[str, Any]:
    return {"type": kind, "data": data}


def media(kind: str, media_kind: str, value: str) -> dict[str, Any]:
    return {"type": kind, "data": {"media": {"kind": media_kind, "value": value}}}


PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGBgAAAABQABpfZFQAAAAABJRU5ErkJggg=="

# --- valid: every type on its own -------------------------------------------------------------
SINGLE_VALID: dict[str, dict[str, Any]] = {
    "text": seg("text", text="hello"),
    "text_empty_string": seg("text", text=""),
    "markdown": seg("markdown", content="**bold**\n- a\n- b\n```py\nprint(1)\n```"),
    "mention_sender": seg("mention", target="10001"),
    "mention_member": seg("mention", target="10002"),
    "mention_replied_author": seg("mention", target="10004"),
    "mention_looked_up": seg("mention", target="10005"),
    "reply": seg("reply", message_id="m-123"),
    "forward": seg("forward", forward_id="fw-9"),
    "face_string": seg("face", id="14"),
    "face_int": seg("face", id=14),
    "face_float": seg("face", id=14.5),
    "face_negative": seg("face", id=-1),
    "face_big_int": seg("face", id=123456789012345678901234567890),
    "dice": seg("dice"),
    "rps": seg("rps"),
    "share": seg("share", url="https://example.com/page", title="A page"),
}
for media_type in ("image", "audio", "video", "file"):
    for media_kind, value in (
        ("url", f"https://example.com/x.{media_type}"),
        ("path", f"out/{media_type}.bin"),
        ("base64", PNG_B64),
        ("file", f"platform-file-{media_type}"),
    ):
        SINGLE_VALID[f"{media_type}_{media_kind}"] = media(media_type, media_kind, value)

for name, segment in SINGLE_VALID.items():
    add(f"valid_single_{name}", reply(segment), "ok")

# The seed's own example.
add(
    "valid_seed_example",
    reply(
        seg("markdown", content="**处理结果**\n"),
        seg("text", text="请 "),
        seg("mention", target="10002"),
        seg("text", text=" 看看这个问题。"),
        media("image", "url", "https://example.com/result.png"),
        ensure_ascii=False,
    ),
    "ok",
)

# Every type in one reply, and in shuffled orders (order is kept; the test compares it).
all_segments = list(SINGLE_VALID.values())
add("valid_all_types_in_order", reply(*all_segments), "ok", keeps_order=True)
rng = random.Random(20261130)
for index in range(30):
    picked = rng.sample(all_segments, rng.randint(2, 9))
    add(f"valid_shuffled_{index:02d}", reply(*picked), "ok", keeps_order=True)

# Several mentions interleaved with text.
add(
    "valid_interleaved_mentions",
    reply(
        seg("mention", target="10001"),
        seg("text", text=" and "),
        seg("mention", target="10002"),
        seg("text", text=" and "),
        seg("mention", target="10003"),
    ),
    "ok",
    keeps_order=True,
)

# Formatting variants of valid JSON.
add("valid_pretty_printed", reply(seg("text", text="hi"), indent=2), "ok")
add("valid_surrounding_whitespace", "  \n\t" + reply(seg("text", text="hi")) + "\n\n", "ok")
add("valid_key_order_data_first", '{"segments":[{"data":{"text":"x"},"type":"text"}]}', "ok")

# Unicode-heavy.
for name, text in {
    "chinese": "你好，世界！这是一个测试。",
    "emoji": "👍🏽🎉 family: 👨‍👩‍👧‍👦",
    "rtl": "مرحبا بالعالم שלום",
    "combining": "e\u0301 a\u0308 Z\u0335\u0321",
    "zero_width": "a\u200bb\u200dc\ufeffd",
    "escaped_surrogate_pair": None,
    "newlines_tabs": "line1\nline2\tTabbed\r\n",
    "quotes_backslashes": 'he said "hi" \\ ok',
}.items():
    if text is None:
        add(
            "valid_unicode_escaped_surrogate_pair",
            '{"segments":[{"type":"text","data":{"text":"\\ud83d\\ude00"}}]}',
            "ok",
        )
    else:
        add(f"valid_unicode_{name}", reply(seg("text", text=text), ensure_ascii=False), "ok")
        add(f"valid_unicode_{name}_ascii_escaped", reply(seg("text", text=text), ensure_ascii=True), "ok")

# Oversized but valid (no size cap in the contract; the platform splits long text).
add("valid_oversized_text", reply(seg("text", text="长" * 40_000), ensure_ascii=False), "ok")
add("valid_many_segments", reply(*[seg("text", text=str(i)) for i in range(2000)]), "ok")

# --- no reply ----------------------------------------------------------------------------------
add("no_reply_compact", '{"segments":[]}', "no_reply")
add("no_reply_spaced", '{ "segments" : [ ] }', "no_reply")
add("no_reply_pretty", '{\n  "segments": []\n}\n', "no_reply")

# --- invalid: not exactly one JSON object (S10) --------------------------------------------------
good = reply(seg("text", text="hello"))
for name, text in {
    "fenced_json": f"```json\n{good}\n```",
    "fenced_plain": f"```\n{good}\n```",
    "json_in_prose": f"Here is my reply: {good}",
    "trailing_text": f"{good} Hope this helps!",
    "leading_text": f"Sure! {good}",
    "two_objects": f"{good}{good}",
    "two_objects_newline": f"{good}\n{good}",
    "plain_text": "hello there",
    "empty_string": "",
    "whitespace_only": "   \n ",
    "truncated": good[:-3],
    "single_quotes": good.replace('"', "'"),
    "trailing_comma": '{"segments":[{"type":"text","data":{"text":"a"}},]}',
    "trailing_comma_object": '{"segments":[],}',
    "comment": '{"segments":[] /* none */}',
    "unquoted_keys": "{segments:[]}",
    "python_repr": "{'segments': []}",
    "bom_prefix": "\ufeff" + good,
    "lone_surrogate": '{"segments":[{"type":"text","data":{"text":"\\ud800"}}]}',
    "raw_control_char": '{"segments":[{"type":"text","data":{"text":"a\u0001b"}}]}',
    "oversized_prose": "x" * 40_000 + good,
}.items():
    add(f"invalid_{name}", text, "invalid", detail="invalid_json")

# Valid JSON that is not an object.
for name, text in {
    "top_level_array": "[]",
    "top_level_segments_array": json.dumps([seg("text", text="a")]),
    "top_level_string": '"hello"',
    "top_level_number": "42",
    "top_level_null": "null",
    "top_level_true": "true",
}.items():
    add(f"invalid_{name}", text, "invalid", detail="not_an_object")

# --- invalid: structure ------------------------------------------------------------------------
STRUCTURE_INVALID: dict[str, Any] = {
    "empty_object": {},
    "segments_null": {"segments": None},
    "segments_object": {"segments": {"type": "text", "data": {"text": "a"}}},
    "segments_string": {"segments": "hello"},
    "extra_top_level_field": {"segments": [], "thinking": "hmm"},
    "extra_segment_field": {"segments": [{"type": "text", "data": {"text": "a"}, "id": 1}]},
    "extra_data_field": {"segments": [seg("text", text="a", bold=True)]},
    "extra_media_field": {
        "segments": [
            {"type": "image", "data": {"media": {"kind": "url", "value": "https://e.com/a.png", "name": "a.png"}}}
        ]
    },
    "extra_field_in_dice": {"segments": [seg("dice", value=6)]},
    "extra_share_field": {"segments": [seg("share", url="https://e.com", title="t", image="x")]},
    "missing_type": {"segments": [{"data": {"text": "a"}}]},
    "missing_data": {"segments": [{"type": "text"}]},
    "missing_text": {"segments": [seg("text")]},
    "missing_markdown_content": {"segments": [seg("markdown", text="a")]},
    "missing_media": {"segments": [seg("image")]},
    "missing_media_kind": {"segments": [{"type": "image", "data": {"media": {"value": "https://e.com"}}}]},
    "missing_media_value": {"segments": [{"type": "image", "data": {"media": {"kind": "url"}}}]},
    "missing_share_title": {"segments": [seg("share", url="https://e.com")]},
    "missing_share_url": {"segments": [seg("share", title="t")]},
    "missing_reply_message_id": {"segments": [seg("reply")]},
    "missing_forward_id": {"segments": [seg("forward")]},
    "missing_face_id": {"segments": [seg("face")]},
    "missing_dice_data": {"segments": [{"type": "dice"}]},
    "dice_data_null": {"segments": [{"type": "dice", "data": None}]},
    "dice_data_array": {"segments": [{"type": "dice", "data": []}]},
    "data_is_string": {"segments": [{"type": "text", "data": "hello"}]},
    "segment_is_string": {"segments": ["hello"]},
    "segment_is_null": {"segments": [None]},
    "nested_segments": {"segments": [{"segments": []}]},
    "unknown_type_at": {"segments": [seg("at", qq="10001")]},
    "unknown_type_emoji": {"segments": [seg("emoji", id=1)]},
    "type_wrong_case": {"segments": [seg("Text", text="a")]},
    "type_number": {"segments": [{"type": 1, "data": {"text": "a"}}]},
    "type_null": {"segments": [{"type": None, "data": {"text": "a"}}]},
    "text_data_on_mention": {"segments": [seg("mention", text="@bob")]},
    "media_data_on_text": {"segments": [{"type": "text", "data": {"media": {"kind": "url", "value": "x"}}}]},
    # No coercion (S10): numbers are not strings and strings are not numbers.
    "numeric_mention_target": {"segments": [seg("mention", target=10001)]},
    "numeric_message_id": {"segments": [seg("reply", message_id=123)]},
    "numeric_forward_id": {"segments": [seg("forward", forward_id=9)]},
    "numeric_text": {"segments": [seg("text", text=42)]},
    "numeric_share_title": {"segments": [seg("share", url="https://e.com", title=1)]},
    "numeric_media_value": {"segments": [{"type": "image", "data": {"media": {"kind": "url", "value": 5}}}]},
    "bool_face_id": {"segments": [seg("face", id=True)]},
    "null_face_id": {"segments": [seg("face", id=None)]},
    "array_face_id": {"segments": [seg("face", id=[1])]},
    "object_face_id": {"segments": [seg("face", id={"id": 1})]},
    "null_text": {"segments": [seg("text", text=None)]},
    "array_text": {"segments": [seg("text", text=["a", "b"])]},
    # Media kinds are exactly url/path/base64/file.
    "media_kind_upper": {"segments": [media("image", "URL", "https://e.com/a.png")]},
    "media_kind_link": {"segments": [media("image", "link", "https://e.com/a.png")]},
    "media_kind_http": {"segments": [media("image", "http", "https://e.com/a.png")]},
    "media_kind_empty": {"segments": [media("image", "", "https://e.com/a.png")]},
    "media_kind_null": {"segments": [{"type": "image", "data": {"media": {"kind": None, "value": "x"}}}]},
    "media_kind_data": {"segments": [media("video", "data", PNG_B64)]},
    "media_as_string": {"segments": [{"type": "image", "data": {"media": "https://e.com/a.png"}}]},
    "media_url_flat": {"segments": [seg("image", url="https://e.com/a.png")]},
    "media_file_field_onebot": {"segments": [seg("image", file="https://e.com/a.png")]},
    # One bad segment rejects the whole reply (S8), wherever it is.
    "one_bad_segment_first": {"segments": [seg("text", text=1), seg("text", text="ok")]},
    "one_bad_segment_last": {"segments": [seg("text", text="ok")] * 5 + [seg("mention", target=1)]},
    "one_bad_segment_middle": {"segments": [seg("text", text="a"), seg("dice", x=1), seg("text", text="b")]},
    "oversized_with_one_bad": {"segments": [seg("text", text="y" * 40_000), seg("share", url="https://e.com")]},
}
for name, obj in STRUCTURE_INVALID.items():
    add(f"invalid_{name}", json.dumps(obj, ensure_ascii=False), "invalid", detail="schema:")
# pydantic-core's JSON reader accepts NaN/Infinity tokens; the only number field (face.id) refuses
# non-finite values, so these are still rejected, as schema errors rather than JSON errors.
add("invalid_face_nan", '{"segments":[{"type":"face","data":{"id":NaN}}]}', "invalid", detail="schema:")
add("invalid_face_infinity", '{"segments":[{"type":"face","data":{"id":-Infinity}}]}', "invalid", detail="schema:")
add("invalid_nan_in_text_field", '{"segments":[{"type":"text","data":{"text":NaN}}]}', "invalid", detail="schema:")
add("invalid_face_1e400", '{"segments":[{"type":"face","data":{"id":1e400}}]}', "invalid", detail="schema:")
# Duplicate keys: the parser would keep the last and silently drop the rest (partial acceptance).
add(
    "invalid_duplicate_segments_key_both_valid",
    '{"segments":[{"type":"text","data":{"text":"first"}}],"segments":[]}',
    "invalid",
    detail="duplicate_key",
)
add(
    "invalid_duplicate_text_key_in_data",
    '{"segments":[{"type":"text","data":{"text":"shown","text":"hidden"}}]}',
    "invalid",
    detail="duplicate_key",
)
add(
    "invalid_duplicate_type_key",
    '{"segments":[{"type":"dice","type":"rps","data":{}}]}',
    "invalid",
    detail="duplicate_key",
)
add(
    "invalid_duplicate_segments_key_last_bad",
    '{"segments":[{"type":"text","data":{"text":"a"}}],"segments":[1]}',
    "invalid",
    detail="schema:",
)

# --- mentions (S5, S7) ----------------------------------------------------------------------------
add(
    "mention_unknown_plain",
    reply(seg("text", text="hi "), seg("mention", target="77777")),
    "ok",
    unknown_mentions=1,
    plain_mention_text="@77777",
)
add("mention_bot_self_is_not_a_user", reply(seg("mention", target="90000")), "ok", unknown_mentions=1)
add("mention_nickname_as_target", reply(seg("mention", target="@Bob")), "ok", unknown_mentions=1)
add("mention_empty_target", reply(seg("mention", target="")), "ok", unknown_mentions=1)
add(
    "mention_two_unknown_one_known",
    reply(seg("mention", target="a1"), seg("mention", target="10001"), seg("mention", target="a2")),
    "ok",
    unknown_mentions=2,
)
add(
    "mention_unknown_reject",
    reply(seg("mention", target="77777")),
    "unknown_mention",
    unknown_mentions=1,
    policy={"mention_policy": "reject"},
)
add("mention_known_reject_policy_ok", reply(seg("mention", target="10002")), "ok", policy={"mention_policy": "reject"})
add(
    "mention_unknown_allow",
    reply(seg("mention", target="77777")),
    "ok",
    unknown_mentions=0,
    policy={"mention_policy": "allow"},
)
add("mention_textual_at_is_just_text", reply(seg("text", text="@10002 look")), "ok", unknown_mentions=0)

# --- leaks (S14): every nested string -------------------------------------------------------------
SECRETS: dict[str, str] = {
    "openai_key": "sk-proj-Abcdefghijklmnopqrstuvwxyz0123456789",
    "anthropic_key": "sk-ant-api03-abcdefghijklmnopqrstuvwxyzABCDEFG_hij",
    "aws_akid": "AKIAIOSFODNN7EXAMPLE",
    "volcengine_ak": "AKLTYzRlNjE5ZjE0OGY2NDg0ZDk3MjQ5ZjYwZjM",
    "github_pat_classic": "ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
    "github_pat_fine": "github_pat_11ABCDEFG0abcdefghijkl_mnopqrstuvwxyz0123456789",
    "slack_bot": "xoxb-1234567890-1234567890123-abcdefghijklmnopqrstuvwx",
    "slack_webhook": "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
    "telegram_bot": "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw1",
    "bearer": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz012345",
    "jwt": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N",
    "pem": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----",
    "pem_rsa_cut_off": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA",
    "ark_key_labelled": "ARK_API_KEY=5e1e5a22-1d5b-4c55-9d23-0123456789ab",
    "google_key": "AIzaSyA1234567890abcdefghijklmnopqrstuv",
    "configured": CONFIGURED_SECRET,
}
for name, secret in SECRETS.items():
    add(
        f"leak_text_{name}",
        reply(seg("text", text=f"the value is {secret} ok")),
        "ok",
        leak_hits=1,
        must_not_contain=secret,
    )
for where, segment in {
    "markdown": seg("markdown", content=f"```\n{CONFIGURED_SECRET}\n```"),
    "share_url": seg("share", url=f"https://e.com/?k={CONFIGURED_SECRET}", title="t"),
    "share_title": seg("share", url="https://e.com", title=f"key {CONFIGURED_SECRET}"),
    "reply_message_id": seg("reply", message_id=CONFIGURED_SECRET),
    "forward_id": seg("forward", forward_id=CONFIGURED_SECRET),
    "face_id_string": seg("face", id=CONFIGURED_SECRET),
    "mention_target_unknown": seg("mention", target=CONFIGURED_SECRET),
}.items():
    add(
        f"leak_nested_{where}",
        reply(seg("text", text="x"), segment),
        "ok",
        leak_hits=1,
        must_not_contain=CONFIGURED_SECRET,
        unknown_mentions=1 if where.startswith("mention") else 0,
    )
add(
    "leak_nested_media_url",
    reply(media("image", "url", f"https://e.com/a.png?token={CONFIGURED_SECRET}")),
    "ok",
    leak_hits=1,
    media_rejected=1,
    must_not_contain=CONFIGURED_SECRET,
)
add(
    "leak_nested_media_path",
    reply(media("file", "path", f"dir/{CONFIGURED_SECRET}.txt")),
    "ok",
    leak_hits=1,
    media_rejected=1,
    must_not_contain=CONFIGURED_SECRET,
)
add(
    "leak_two_in_one_string",
    reply(seg("text", text=f"{CONFIGURED_SECRET} and {SECRETS['aws_akid']}")),
    "ok",
    leak_hits=2,
    must_not_contain=CONFIGURED_SECRET,
)
add(
    "leak_block_policy",
    reply(seg("text", text=f"oops {SECRETS['openai_key']}")),
    "leak_blocked",
    leak_hits=1,
    policy={"leak_action": "block"},
    must_not_contain=SECRETS["openai_key"],
)
add(
    "leak_block_policy_nested",
    reply(seg("share", url="https://e.com", title=CONFIGURED_SECRET)),
    "leak_blocked",
    leak_hits=1,
    policy={"leak_action": "block"},
    must_not_contain=CONFIGURED_SECRET,
)
add(
    "leak_block_policy_clean_reply",
    reply(seg("text", text="nothing secret here")),
    "ok",
    policy={"leak_action": "block"},
)
add("leak_not_a_uuid_alone", reply(seg("text", text="id 5e1e5a22-1d5b-4c55-9d23-0123456789ab")), "ok", leak_hits=0)
add("leak_words_key_token_clean", reply(seg("text", text="the key to the token economy")), "ok", leak_hits=0)


def main() -> None:
    names = [case["name"] for case in cases]
    assert len(names) == len(set(names)), "duplicate case names"
    with OUT.open("w", encoding="utf-8") as out:
        for case in cases:
            out.write(json.dumps(case, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases → {OUT}")


if __name__ == "__main__":
    main()
