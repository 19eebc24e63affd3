"""What a worker's web server may expose, decided before it starts."""

from __future__ import annotations

import ipaddress

from pipeline.errors import ConfigurationError
from pipeline.settings import Settings


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name (or "", all interfaces): reachable from elsewhere


def worker_problems(settings: Settings) -> list[str]:
    """What a worker must not run with: nothing to serve, a console bot while the console is off,
    or a console anyone who reaches the port could read. Each says how to fix it."""
    problems = []
    console_bots = [b for b in settings.bots if b.platform == "console"]
    if not settings.bots:
        problems.append(
            "no bots are configured: list them as [[bots]] in the TOML file named by SWITCHBOARD_CONFIG "
            "(see deploy/switchboard.toml), or try the development console with SWITCHBOARD_CONSOLE_ENABLED=true"
        )
    if console_bots and not settings.console_enabled:
        names = ", ".join(b.bot_id for b in console_bots)
        problems.append(
            f"console bot(s) {names} are configured but the console is off: "
            "set SWITCHBOARD_CONSOLE_ENABLED=true, or remove them from the SWITCHBOARD_CONFIG file"
        )
    open_bots = [b.bot_id for b in console_bots if b.secret("token") is None]
    if settings.console_enabled and open_bots and not is_loopback(settings.web_host):
        problems.append(
            f"the console is enabled on {settings.web_host or 'every interface'}:{settings.web_port} and "
            f"console bot(s) {', '.join(open_bots)} have no token, so anyone who reaches the port could "
            "read and write their chats. Set SWITCHBOARD_CONSOLE_TOKEN (the demo bot) or credentials.token "
            "of each console bot, or SWITCHBOARD_WEB_HOST=127.0.0.1, or SWITCHBOARD_CONSOLE_ENABLED=false"
        )
    return problems


def check_worker_settings(settings: Settings) -> None:
    """`worker_problems` as a ConfigurationError (for code that starts a worker's web server)."""
    problems = worker_problems(settings)
    if problems:
        raise ConfigurationError("; ".join(problems))


def metrics_open(settings: Settings) -> bool:
    """/metrics without a token only on loopback; beyond it, a token is required (without one,
    every request is refused)."""
    return settings.metrics_token is None and is_loopback(settings.web_host)


def exposure_warnings(settings: Settings) -> list[str]:
    """What a worker beyond loopback should be told at start-up (allowed, but worth knowing). Open
    webhooks are each platform's own start-up warnings (`Platform.startup_warnings`)."""
    if is_loopback(settings.web_host) or settings.metrics_token is not None:
        return []
    return [
        f"/metrics on {settings.web_host or 'every interface'}:{settings.web_port} refuses every request: "
        "set SWITCHBOARD_METRICS_TOKEN (and the same bearer token in the Prometheus scrape config)"
    ]
