"""A bot whose webhook anyone may call is named in a warning when the worker starts its runtime."""

from __future__ import annotations

import logging

import pytest

from pipeline.runtime import Runtime
from pipeline.settings import BotConfig, Settings

# What a Lark bot needs to load at all (its `required_credentials`), besides the webhook's own.
LARK_APP = {"app_id": "cli_app", "app_secret": "app-secret"}


async def _nowhere(topic: str, key: str | None, value: bytes) -> None:
    raise AssertionError("nothing is produced at start-up")


async def test_secret_less_bots_are_named_at_start_up(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings(
        redis_url=redis_url,
        bots=[
            BotConfig(platform="telegram", bot_id="tg-closed", credentials={"token": "1:t", "webhook_secret": "s"}),
            BotConfig(platform="onebot", bot_id="qq-closed", credentials={"secret": "s"}),
            BotConfig(
                platform="lark", bot_id="lk-token-only", credentials={**LARK_APP, "verification_token": "VERIFY-VALUE"}
            ),
            BotConfig(platform="lark", bot_id="lk-signed", credentials={**LARK_APP, "encrypt_key": "e"}),
            BotConfig(platform="slack", bot_id="sl1", credentials={"signing_secret": "s", "bot_token": "xoxb-1"}),
        ],
    )
    runtime = Runtime(settings, _nowhere)
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime"):
        await runtime.start()
    try:
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        # The leak check's own warnings (these test credentials are short) are tested elsewhere.
        warnings = [w for w in warnings if not w.startswith("leak check:")]
        # Telegram and OneBot webhooks without their secret are refused with the settings (see
        # tests/connections/test_settings.py); Lark's token-only mode stays allowed, with a warning.
        assert len(warnings) == 1, warnings
        (lark,) = warnings
        assert lark.startswith("lark bot 'lk-token-only': no encrypt_key credential: Lark does not sign")
        # A warning names what is missing, never a credential's value.
        assert "VERIFY-VALUE" not in lark
    finally:
        await runtime.stop()
