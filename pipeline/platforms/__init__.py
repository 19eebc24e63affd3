"""Platforms: one module each, the same small interface (`base.Platform`)."""

from __future__ import annotations

import importlib

from pipeline.platforms.base import (
    MediaLoader,
    Platform,
    PlatformCall,
    PlatformProfile,
    SendOutcome,
    WebhookRequest,
    WebhookResult,
)
from pipeline.platforms.exceptions import PlatformError, UnknownPlatform, WebhookRejected

# Imported lazily: a worker serving one platform does not import the others.
_REGISTRY: dict[str, str] = {
    "console": "pipeline.platforms.console:ConsolePlatform",
    "onebot": "pipeline.platforms.onebot:OneBotPlatform",
    "telegram": "pipeline.platforms.telegram:TelegramPlatform",
    "lark": "pipeline.platforms.lark:LarkPlatform",
    "slack": "pipeline.platforms.slack:SlackPlatform",
    "dingtalk": "pipeline.platforms.dingtalk:DingTalkPlatform",
    "qqbot": "pipeline.platforms.qqbot:QQBotPlatform",
    "discord": "pipeline.platforms.discord:DiscordPlatform",
    "satori": "pipeline.platforms.satori:SatoriPlatform",
    "wecom": "pipeline.platforms.wecom:WeComPlatform",
    "line": "pipeline.platforms.line:LinePlatform",
    "whatsapp": "pipeline.platforms.whatsapp:WhatsAppPlatform",
    "matrix": "pipeline.platforms.matrix:MatrixPlatform",
}
_INSTANCES: dict[str, Platform] = {}


def known_platforms() -> list[str]:
    return sorted(_REGISTRY)


def get_platform(name: str) -> Platform:
    platform = _INSTANCES.get(name)
    if platform is None:
        target = _REGISTRY.get(name)
        if target is None:
            raise UnknownPlatform(f"unknown platform {name!r}; known: {', '.join(known_platforms())}")
        module_name, class_name = target.split(":")
        platform = getattr(importlib.import_module(module_name), class_name)()
        _INSTANCES[name] = platform
    return platform


__all__ = [
    "MediaLoader",
    "Platform",
    "PlatformCall",
    "PlatformError",
    "PlatformProfile",
    "SendOutcome",
    "UnknownPlatform",
    "WebhookRejected",
    "WebhookRequest",
    "WebhookResult",
    "get_platform",
    "known_platforms",
]
