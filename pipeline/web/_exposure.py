"""What a worker's web server may expose, decided before it starts."""

from __future__ import annotations

import ipaddress

from pipeline.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name (or "", all interfaces): reachable from elsewhere


def check_worker_settings(settings: Settings) -> None:
    """Refuse what a worker must not run with: nothing to serve, a console bot while the console is
    off, or a console anyone who reaches the port could read. ValueError says how to fix it."""
    console_bots = [b for b in settings.bots if b.platform == "console"]
    if not settings.bots:
        raise ValueError(
            "no bots are configured: list them as [[bots]] in the TOML file named by SWITCHBOARD_CONFIG "
            "(see deploy/switchboard.toml), or try the development console with SWITCHBOARD_CONSOLE_ENABLED=true"
        )
    if console_bots and not settings.console_enabled:
        names = ", ".join(b.bot_id for b in console_bots)
        raise ValueError(
            f"console bot(s) {names} are configured but the console is off: "
            "set SWITCHBOARD_CONSOLE_ENABLED=true, or remove them from the SWITCHBOARD_CONFIG file"
        )
    open_bots = [b.bot_id for b in console_bots if b.secret("token") is None]
    if settings.console_enabled and open_bots and not is_loopback(settings.web_host):
        raise ValueError(
            f"the console is enabled on {settings.web_host or 'every interface'}:{settings.web_port} and "
            f"console bot(s) {', '.join(open_bots)} have no token, so anyone who reaches the port could "
            "read and write their chats. Set SWITCHBOARD_CONSOLE_TOKEN (the demo bot) or credentials.token "
            "of each console bot, or SWITCHBOARD_WEB_HOST=127.0.0.1, or SWITCHBOARD_CONSOLE_ENABLED=false"
        )


def metrics_open(settings: Settings) -> bool:
    """/metrics without a token only on loopback; beyond it, a token is required (without one,
    every request is refused)."""
    return settings.metrics_token is None and is_loopback(settings.web_host)


def open_webhooks(settings: Settings) -> list[str]:
    """Bots whose webhooks anyone can post to: their platform checks nothing without a secret
    (Telegram without `webhook_secret`, OneBot without `secret`, a console bot without `token`)."""
    from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform

    unsigned = WebhookRequest(headers={}, body=b"{}", query={})
    found = []
    for bot in settings.bots:
        try:
            get_platform(bot.platform).verify(bot, unsigned)
        except WebhookRejected:
            continue
        found.append(f"{bot.platform}/{bot.bot_id}")
    return found


def exposure_warnings(settings: Settings) -> list[str]:
    """What a worker beyond loopback should be told at start-up (allowed, but worth knowing)."""
    if is_loopback(settings.web_host):
        return []
    where = f"{settings.web_host or 'every interface'}:{settings.web_port}"
    warnings = []
    if settings.metrics_token is None:
        warnings.append(
            f"/metrics on {where} refuses every request: set SWITCHBOARD_METRICS_TOKEN (and the same bearer "
            "token in the Prometheus scrape config)"
        )
    unchecked = open_webhooks(settings)
    if unchecked:
        warnings.append(
            f"webhooks of {', '.join(unchecked)} on {where} are not authenticated: anyone can post messages "
            "as any user (set the platform's secret in the bot's credentials)"
        )
    return warnings
