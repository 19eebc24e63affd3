"""Host notices: defaults, overrides, placeholders."""

from __future__ import annotations

import pytest

from pipeline.segments import NoticeCatalog, NoticeKind
from pipeline.segments.notices import DEFAULT_NOTICES


def test_every_kind_has_zh_and_en_defaults() -> None:
    for language in ("zh", "en"):
        assert set(DEFAULT_NOTICES[language]) == set(NoticeKind)
    catalog = NoticeCatalog()
    for kind in NoticeKind:
        for language in ("zh", "en"):
            assert catalog.render(kind, language=language, tool_name="t", who="w").text


def test_overrides_and_fallbacks() -> None:
    catalog = NoticeCatalog(
        default_language="zh",
        language_overrides={"en": {"reply_invalid": "Format problem."}},
        bot_overrides={"bot-7": {"en": {NoticeKind.REPLY_INVALID: "bot-7 format problem."}}},
    )
    assert catalog.render(NoticeKind.REPLY_INVALID, language="en").text == "Format problem."
    assert catalog.render(NoticeKind.REPLY_INVALID, language="en", bot_id="bot-7").text == "bot-7 format problem."
    assert catalog.render(NoticeKind.REPLY_INVALID, language="en", bot_id="other").text == "Format problem."
    # Unknown language → the catalog's default language.
    assert catalog.render(NoticeKind.STOPPED, language="fr").text == DEFAULT_NOTICES["zh"][NoticeKind.STOPPED]
    # A bot override for one kind leaves the others at the language defaults.
    assert catalog.render(NoticeKind.BUSY, language="en", bot_id="bot-7").text == DEFAULT_NOTICES["en"][NoticeKind.BUSY]


def test_confirmation_prompt_placeholders() -> None:
    catalog = NoticeCatalog()
    text = catalog.render(
        NoticeKind.TOOL_CONFIRMATION_PROMPT, language="en", tool_name="rm {-rf}", who="@Alice and admins"
    ).text
    assert "rm {-rf}" in text and "@Alice and admins" in text
    assert "{" not in catalog.render(NoticeKind.CONFIRMATION_REFUSED, language="zh").text


@pytest.mark.parametrize(
    "overrides",
    [{"en": {"busy": "wait {who}"}}, {"en": {"reply_invalid": "broken {"}}, {"en": {"no_such_kind": "x"}}],
)
def test_bad_overrides_fail_at_build_time(overrides: dict[str, dict[str, str]]) -> None:
    with pytest.raises(ValueError):
        NoticeCatalog(language_overrides=overrides)
