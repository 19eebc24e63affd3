# ruff: noqa: RUF001  (Chinese texts use full-width punctuation on purpose)
"""The controls' notices: in the bot's language, and overridable per bot in the bots file."""

from __future__ import annotations

import pytest

from pipeline.settings import BotConfig, Settings
from pipeline.stages.notify import Notifier


def test_the_notices_speak_the_bots_language_and_a_bot_may_rewrite_them() -> None:
    zh = BotConfig(platform="console", bot_id="zh", language="zh", notices={"rate_limited": "慢一点，一分钟后再问。"})
    en = BotConfig(platform="console", bot_id="en", language="en")
    notifier = Notifier(Settings(bots=[zh, en]))
    assert notifier.text(zh, "rate_limited") == "慢一点，一分钟后再问。"
    assert notifier.text(zh, "overloaded") == "抱歉，现在太忙，暂时无法回答，请稍后再试。"
    assert notifier.text(en, "moderated") == "Sorry, I can't respond to that message."
    assert notifier.text(en, "reply_moderated") == "Sorry, this reply was withheld by the chat's content rules."


def test_an_override_with_an_unknown_placeholder_fails_at_start_up() -> None:
    bot = BotConfig(platform="console", bot_id="x", notices={"rate_limited": "wait {minutes} minutes"})
    with pytest.raises(ValueError, match="unknown placeholders"):
        Notifier(Settings(bots=[bot]))
