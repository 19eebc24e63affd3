# ruff: noqa: RUF001  (Chinese texts use full-width punctuation on purpose)
"""Host-written notices (S9, S12): fixed texts per bot and language, never model output.

A `NoticeCatalog` holds zh and en defaults and per-bot / per-language overrides. Templates may use
the placeholders declared for their kind (`{tool_name}`, `{who}`, `{tool_input}`); other braces are
rejected when the catalog is built so that a bad override fails fast at startup, not mid-turn.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum


class NoticeKind(StrEnum):
    REPLY_INVALID = "reply_invalid"
    PROVIDER_ERROR = "provider_error"
    RETRIES_EXHAUSTED = "retries_exhausted"
    SESSION_ERROR = "session_error"
    SESSION_TERMINATED = "session_terminated"
    SESSION_DELETED = "session_deleted"
    ATTACHMENT_UNAVAILABLE = "attachment_unavailable"
    LEAK_BLOCKED = "leak_blocked"
    TOOL_CONFIRMATION_PROMPT = "tool_confirmation_prompt"
    CONFIRMATION_REFUSED = "confirmation_refused"
    BUSY = "busy"
    STOPPED = "stopped"
    RESET = "reset"
    CUSTOM_TOOL_UNAVAILABLE = "custom_tool_unavailable"
    # A turn still running shortly before the platform's reply window closes (QQ's passive replies):
    # the answer will not come here (or, with the bot's active messages, will come separately).
    REPLY_WINDOW_CLOSING = "reply_window_closing"
    REPLY_WINDOW_CLOSING_ACTIVE = "reply_window_closing_active"
    # Controls (docs/controls.md): over a rate limit (once per window), a moderated message or
    # reply, a message whose turn did not start in time under overload.
    RATE_LIMITED = "rate_limited"
    MODERATED = "moderated"
    REPLY_MODERATED = "reply_moderated"
    OVERLOADED = "overloaded"
    # Usage budgets (`pipeline.controls.budgets`).
    BUDGET_SPENT_CHAT = "budget_spent_chat"
    BUDGET_SPENT_USER = "budget_spent_user"
    BUDGET_SPENT_BOT = "budget_spent_bot"
    USAGE_REPORT = "usage_report"
    BUDGET_GRANTED = "budget_granted"
    GRANT_HELP = "grant_help"
    ADMINS_ONLY = "admins_only"


# Placeholders each kind may use; anything else in a template is a configuration error.
NOTICE_PLACEHOLDERS: Mapping[NoticeKind, frozenset[str]] = {
    NoticeKind.TOOL_CONFIRMATION_PROMPT: frozenset({"tool_name", "who", "tool_input"}),
    NoticeKind.CONFIRMATION_REFUSED: frozenset({"who"}),
    NoticeKind.CUSTOM_TOOL_UNAVAILABLE: frozenset({"tool_name"}),
    NoticeKind.BUDGET_SPENT_CHAT: frozenset({"until"}),
    NoticeKind.BUDGET_SPENT_USER: frozenset({"until", "who"}),
    NoticeKind.BUDGET_SPENT_BOT: frozenset({"until"}),
    NoticeKind.USAGE_REPORT: frozenset({"who", "window", "tokens", "seconds"}),
    NoticeKind.BUDGET_GRANTED: frozenset({"who", "amount", "window"}),
}

DEFAULT_NOTICES: Mapping[str, Mapping[NoticeKind, str]] = {
    "en": {
        NoticeKind.REPLY_INVALID: "Sorry, I could not produce a reply in the right format. Please try again.",
        NoticeKind.PROVIDER_ERROR: "Sorry, the model service failed to answer. Please try again later.",
        NoticeKind.RETRIES_EXHAUSTED: "Sorry, the model service is unavailable after several retries. "
        "Please try again later.",
        NoticeKind.SESSION_ERROR: "Sorry, something went wrong in this conversation. Please try again.",
        NoticeKind.SESSION_TERMINATED: "This conversation has ended. Your next message starts a new one.",
        NoticeKind.SESSION_DELETED: "This conversation was removed. Your next message starts a new one.",
        NoticeKind.ATTACHMENT_UNAVAILABLE: "[attachment unavailable]",
        NoticeKind.LEAK_BLOCKED: "Sorry, this reply was withheld because it contained sensitive data.",
        NoticeKind.TOOL_CONFIRMATION_PROMPT: "The assistant wants to run the tool {tool_name} with the input "
        "{tool_input}. {who} may reply /allow or /deny.",
        NoticeKind.CONFIRMATION_REFUSED: "Only {who} may answer this confirmation.",
        NoticeKind.BUSY: "Still working on the previous message; yours will be handled next.",
        NoticeKind.STOPPED: "Stopped.",
        NoticeKind.RESET: "Conversation reset. The next message starts a new conversation.",
        NoticeKind.CUSTOM_TOOL_UNAVAILABLE: "The tool {tool_name} is not available here.",
        NoticeKind.REPLY_WINDOW_CLOSING: "This answer is taking longer than this chat lets me reply to your "
        "message, so it cannot be sent here. Send a new message to get it.",
        NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE: "This answer is taking longer than this chat lets me reply to "
        "your message; it will be sent as a separate message.",
        NoticeKind.RATE_LIMITED: "Too many requests right now; please wait a while before asking again.",
        NoticeKind.MODERATED: "Sorry, I can't respond to that message.",
        NoticeKind.REPLY_MODERATED: "Sorry, this reply was withheld by the chat's content rules.",
        NoticeKind.OVERLOADED: "Sorry, I'm too busy to answer that now. Please try again later.",
        NoticeKind.BUDGET_SPENT_CHAT: "This chat has used up its usage budget. I can answer again after {until}.",
        NoticeKind.BUDGET_SPENT_USER: "{who}, you have used up your usage budget. "
        "I can answer you again after {until}.",
        NoticeKind.BUDGET_SPENT_BOT: "My usage budget is used up. I can answer again after {until}.",
        NoticeKind.USAGE_REPORT: "Usage of {who} in {window}: {tokens} tokens, {seconds} active seconds.",
        NoticeKind.BUDGET_GRANTED: "Granted {amount} more to {who} for {window}.",
        NoticeKind.GRANT_HELP: "Usage: /grant <amount> [@user], e.g. /grant 20000, /grant 20k @alice, /grant 10m.",
        NoticeKind.ADMINS_ONLY: "Only admins may use this command.",
    },
    "zh": {
        NoticeKind.REPLY_INVALID: "抱歉，回复格式生成失败，请稍后重试。",
        NoticeKind.PROVIDER_ERROR: "抱歉，模型服务暂时无法回答，请稍后重试。",
        NoticeKind.RETRIES_EXHAUSTED: "抱歉，模型服务多次重试后仍不可用，请稍后再试。",
        NoticeKind.SESSION_ERROR: "抱歉，本次会话出现错误，请重试。",
        NoticeKind.SESSION_TERMINATED: "本次会话已结束，下一条消息将开始新的会话。",
        NoticeKind.SESSION_DELETED: "本次会话已被删除，下一条消息将开始新的会话。",
        NoticeKind.ATTACHMENT_UNAVAILABLE: "[附件不可用]",
        NoticeKind.LEAK_BLOCKED: "抱歉，该回复包含敏感信息，已被拦截。",
        NoticeKind.TOOL_CONFIRMATION_PROMPT: "助手请求执行工具 {tool_name}，输入为 {tool_input}。"
        "请 {who} 回复 /allow 允许或 /deny 拒绝。",
        NoticeKind.CONFIRMATION_REFUSED: "只有 {who} 可以回复此确认。",
        NoticeKind.BUSY: "正在处理上一条消息，你的消息将随后处理。",
        NoticeKind.STOPPED: "已停止。",
        NoticeKind.RESET: "会话已重置，下一条消息将开始新的会话。",
        NoticeKind.CUSTOM_TOOL_UNAVAILABLE: "工具 {tool_name} 在此不可用。",
        NoticeKind.REPLY_WINDOW_CLOSING: "回答耗时超过了平台允许回复这条消息的时间，无法在此发送。"
        "请再发一条消息获取回答。",
        NoticeKind.REPLY_WINDOW_CLOSING_ACTIVE: "回答耗时超过了平台允许回复这条消息的时间，稍后将作为单独的消息发送。",
        NoticeKind.RATE_LIMITED: "请求太频繁了，请稍后再问。",
        NoticeKind.MODERATED: "抱歉，无法回应这条消息。",
        NoticeKind.REPLY_MODERATED: "抱歉，该回复因本群内容规则已被拦截。",
        NoticeKind.OVERLOADED: "抱歉，现在太忙，暂时无法回答，请稍后再试。",
        NoticeKind.BUDGET_SPENT_CHAT: "本群的用量额度已用完，{until} 之后恢复回答。",
        NoticeKind.BUDGET_SPENT_USER: "{who}，你的用量额度已用完，{until} 之后恢复回答。",
        NoticeKind.BUDGET_SPENT_BOT: "机器人的用量额度已用完，{until} 之后恢复回答。",
        NoticeKind.USAGE_REPORT: "{who} 在 {window} 的用量：{tokens} 个 token，活跃 {seconds} 秒。",
        NoticeKind.BUDGET_GRANTED: "已为 {who} 在 {window} 增加额度 {amount}。",
        NoticeKind.GRANT_HELP: "用法：/grant <数量> [@用户]，例如 /grant 20000、/grant 20k @alice、/grant 10m。",
        NoticeKind.ADMINS_ONLY: "只有管理员可以使用此命令。",
    },
}


@dataclass(frozen=True, slots=True)
class Notice:
    """A host-written message: its kind, the language it was rendered in, and the final text."""

    kind: NoticeKind
    text: str
    language: str


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _check_template(kind: NoticeKind, template: str) -> None:
    try:
        names = _template_fields(template)
    except ValueError as error:  # unbalanced braces
        raise ValueError(f"notice {kind.value}: malformed template") from error
    unknown = names - NOTICE_PLACEHOLDERS.get(kind, frozenset())
    if unknown:
        raise ValueError(f"notice {kind.value}: unknown placeholders {sorted(unknown)}")


class _Params(dict[str, str]):
    # A placeholder the caller did not supply renders empty instead of raising mid-turn.
    def __missing__(self, key: str) -> str:
        return ""


@dataclass(frozen=True)
class NoticeCatalog:
    """Notice texts by (bot, language) with fallbacks.

    Lookup order for a kind: bot+language override, language-wide override, built-in language
    default, then the same chain for `default_language`, then built-in English.
    """

    default_language: str = "en"
    # {language: {kind: template}} applied to every bot.
    language_overrides: Mapping[str, Mapping[NoticeKind | str, str]] = field(default_factory=dict)
    # {bot_id: {language: {kind: template}}}.
    bot_overrides: Mapping[str, Mapping[str, Mapping[NoticeKind | str, str]]] = field(default_factory=dict)
    _table: dict[tuple[str | None, str], dict[NoticeKind, str]] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        table: dict[tuple[str | None, str], dict[NoticeKind, str]] = {}
        for language, defaults in DEFAULT_NOTICES.items():
            table[(None, language)] = dict(defaults)
        for language, overrides in self.language_overrides.items():
            table.setdefault((None, language), {}).update(self._checked(overrides))
        for bot_id, by_language in self.bot_overrides.items():
            for language, overrides in by_language.items():
                table[(bot_id, language)] = self._checked(overrides)
        object.__setattr__(self, "_table", table)

    @staticmethod
    def _checked(texts: Mapping[NoticeKind | str, str]) -> dict[NoticeKind, str]:
        checked: dict[NoticeKind, str] = {}
        for raw_kind, template in texts.items():
            kind = NoticeKind(raw_kind)  # ValueError on an unknown kind name
            _check_template(kind, template)
            checked[kind] = template
        return checked

    def template(self, kind: NoticeKind, *, language: str | None = None, bot_id: str | None = None) -> str:
        for lang in (language or self.default_language, self.default_language, "en"):
            for owner in (bot_id, None) if bot_id is not None else (None,):
                text = self._table.get((owner, lang), {}).get(kind)
                if text is not None:
                    return text
        return DEFAULT_NOTICES["en"][kind]

    def render(
        self,
        kind: NoticeKind,
        *,
        language: str | None = None,
        bot_id: str | None = None,
        **params: str,
    ) -> Notice:
        template = self.template(kind, language=language, bot_id=bot_id)
        text = template.format_map(_Params(params)) if params or "{" in template else template
        return Notice(kind=kind, text=text, language=language or self.default_language)


DEFAULT_CATALOG = NoticeCatalog()
