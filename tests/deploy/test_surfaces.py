"""Every surface the shipped deployment files publish is authenticated or off.

docker-compose.yml, the Dockerfile and deploy/k8s run workers on 0.0.0.0. For each, the worker's
settings are built the way the file builds them and checked the way the worker checks them at
start-up (`pipeline.web.check_worker_settings`): the console is off, or on with a token (a worker
refuses an open one); /metrics has a bearer token that the shipped Prometheus sends; every shipped
bot's webhooks are authenticated; nothing else is published beyond loopback.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from pipeline.platforms import WebhookRejected, WebhookRequest, get_platform
from pipeline.settings import Settings
from pipeline.web import is_loopback, worker_problems
from tests.deploy.support import (
    COMPOSE_FILE,
    DEPLOY,
    K8S,
    PROMETHEUS_CONFIG,
    ROOT,
    load_yaml,
    load_yaml_all,
    switchboard_environment,
)
from tests.deploy.test_compose import ARK_DOTENV, bind_mounts, dockerfile_env, env_of, services, workers

BOTS_FILE = DEPLOY / "switchboard.toml"
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?([-?])([^}]*))?\}")


def compose_value(value: str, dotenv: dict[str, str]) -> str:
    """A value as Compose interpolates it with `dotenv` as the .env file; a required variable
    (`${X:?…}`) that `dotenv` lacks fails, as Compose would."""

    def one(match: re.Match[str]) -> str:
        name, kind, rest = match.group(1), match.group(2), match.group(3)
        if dotenv.get(name):
            return dotenv[name]
        if kind == "?":
            raise LookupError(f"compose refuses to start without {name}: {rest}")
        return rest if kind == "-" else ""

    return _VARIABLE.sub(one, value)


def compose_worker_settings(dotenv: dict[str, str]) -> Settings:
    worker = next(iter(workers(load_yaml(COMPOSE_FILE)).values()))
    env = {k: compose_value(v, dotenv) for k, v in env_of(worker).items()}
    config = env["SWITCHBOARD_CONFIG"]
    source = next(s for s, t in bind_mounts(worker) if config.startswith(t))
    env["SWITCHBOARD_CONFIG"] = str(ROOT / source)  # the file compose mounts there
    with switchboard_environment({**dockerfile_env(), **env}):
        return Settings()


def k8s_docs() -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in load_yaml_all(path)]


def k8s_worker_settings(tmp_path: Path) -> Settings:
    docs = k8s_docs()
    configmap = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "switchboard-env")
    bots = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "switchboard-bots")
    secret = next(d for d in docs if d["kind"] == "Secret")["stringData"]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {k: str(v) for k, v in configmap["data"].items()}
    for item in container.get("env", []):
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            env[item["name"]] = secret[ref["key"]]
    (tmp_path / "switchboard.toml").write_text(bots["data"]["switchboard.toml"])
    env["SWITCHBOARD_CONFIG"] = str(tmp_path / "switchboard.toml")
    with switchboard_environment({**dockerfile_env(), **env}):
        return Settings()


def refusal(settings: Settings) -> str | None:
    """Why a worker with these settings refuses to start (None: it starts)."""
    return "; ".join(worker_problems(settings)) or None


def open_webhooks(settings: Settings) -> list[str]:
    """Bots whose webhooks take a request that carries no signature, secret or token at all."""
    unsigned = WebhookRequest(headers={}, body=b"{}", query={})
    found = []
    for bot in settings.bots:
        try:
            get_platform(bot.platform).verify(bot, unsigned)
        except WebhookRejected:
            continue
        found.append(f"{bot.platform}/{bot.bot_id}")
    return found


def assert_nothing_open(settings: Settings) -> None:
    """A worker that starts with these settings beyond loopback serves nothing unauthenticated."""
    assert refusal(settings) is None
    assert not is_loopback(settings.web_host), "the shipped workers listen beyond loopback"
    assert settings.metrics_token is not None, "/metrics needs its token (it answers nobody without one)"
    assert open_webhooks(settings) == [], "bots whose webhooks anyone can post to"
    assert all(b.secret("token") for b in settings.bots if b.platform == "console")


# -- docker-compose.yml ---------------------------------------------------------------------------------
def test_compose_publishes_only_the_proxy_beyond_loopback() -> None:
    for name, svc in services(load_yaml(COMPOSE_FILE)).items():
        for mapping in svc.get("ports", []):
            text = str(mapping["published"] if isinstance(mapping, dict) else mapping)
            host = (mapping.get("host_ip") if isinstance(mapping, dict) else None) or (
                text.rsplit(":", 2)[0] if text.count(":") == 2 else "0.0.0.0"
            )
            if name == "proxy":
                continue
            assert is_loopback(host), f"{name} publishes {mapping} beyond loopback"
    cfg = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert re.search(r"^\s*http-request deny .*\{ path_beg /metrics \}", cfg, re.M), "the proxy must hide /metrics"


def test_compose_needs_the_metrics_token_and_prometheus_sends_it() -> None:
    with pytest.raises(LookupError, match="SWITCHBOARD_METRICS_TOKEN"):
        compose_worker_settings(ARK_DOTENV)
    compose = load_yaml(COMPOSE_FILE)
    prometheus = services(compose)["prometheus"]
    assert "metrics_token" in prometheus["secrets"]
    assert compose["secrets"]["metrics_token"] == {"environment": "SWITCHBOARD_METRICS_TOKEN"}
    job = next(j for j in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"] if j["job_name"] == "switchboard")
    assert job["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/metrics_token"}


def test_compose_names_the_session_api_or_refuses() -> None:
    """No silent fallback to the simulator: without a session API in .env, Compose refuses."""
    with pytest.raises(LookupError, match="SWITCHBOARD_SESSION_BASE_URL"):
        compose_worker_settings({"SWITCHBOARD_METRICS_TOKEN": "m" * 32})
    settings = compose_worker_settings({**ARK_DOTENV, "SWITCHBOARD_METRICS_TOKEN": "m" * 32})
    assert settings.session_base_url == ARK_DOTENV["SWITCHBOARD_SESSION_BASE_URL"]
    assert settings.session_provisioner == "ark-openapi", "unset, the provisioner follows the profile"


def test_compose_workers_serve_nothing_unauthenticated() -> None:
    secrets = {**ARK_DOTENV, "SWITCHBOARD_METRICS_TOKEN": "m" * 32}
    # As shipped: the console is off and no bot is configured: the workers refuse to start and say
    # where the bots go (nothing is served until they are added).
    shipped = compose_worker_settings(secrets)
    assert not shipped.console_enabled
    assert "SWITCHBOARD_CONFIG" in (refusal(shipped) or "")
    # The console without its token: refused, not served open.
    no_token = compose_worker_settings({**secrets, "SWITCHBOARD_CONSOLE_ENABLED": "true"})
    assert "have no token" in (refusal(no_token) or "")
    # The documented way to try it: the console bot with its token.
    demo = compose_worker_settings({**secrets, "SWITCHBOARD_CONSOLE_ENABLED": "true", "SWITCHBOARD_CONSOLE_TOKEN": "c"})
    assert_nothing_open(demo)


# -- Kubernetes and the image -----------------------------------------------------------------------------
def test_k8s_workers_serve_nothing_unauthenticated(tmp_path: Path) -> None:
    settings = k8s_worker_settings(tmp_path)
    assert not settings.console_enabled
    assert settings.metrics_token is not None, "the Deployment must give /metrics its token from the Secret"
    assert "SWITCHBOARD_CONFIG" in (refusal(settings) or ""), "no bot is shipped: the file says to add them"
    settings.bots = _example_bots(tmp_path / "switchboard.toml")
    assert settings.bots, "the bots file shows an example"
    assert_nothing_open(settings)


def test_the_image_alone_serves_nothing_unauthenticated() -> None:
    with switchboard_environment(dockerfile_env()):
        settings = Settings()
    assert not is_loopback(settings.web_host)
    assert not settings.console_enabled
    # Without a token, /metrics on 0.0.0.0 answers nobody (tests/web: test_metrics_need_their_token…).
    assert settings.metrics_token is None


def _example_bots(path: Path) -> list[Any]:
    """The example bots a bots file shows in its comments: each `# [[bots]]` and the `# key = value`
    lines after it."""
    from pipeline.settings import BotConfig

    blocks: list[list[str]] = []
    for line in path.read_text().splitlines():
        text = line.strip().removeprefix("#").strip()
        if text == "[[bots]]":
            blocks.append([])
        elif blocks and re.match(r"^[a-z_]+\s*=", text) and line.strip().startswith("#"):
            blocks[-1].append(text)
        elif blocks and blocks[-1]:
            blocks.append([])  # the example ended
    return [BotConfig.model_validate(tomllib.loads("\n".join(b))) for b in blocks if b]


def test_every_bot_the_files_ship_or_show_has_authenticated_webhooks(tmp_path: Path) -> None:
    bots_k8s = next(d for d in k8s_docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "switchboard-bots")
    (tmp_path / "k8s.toml").write_text(bots_k8s["data"]["switchboard.toml"])
    for path in (BOTS_FILE, tmp_path / "k8s.toml"):
        shipped = tomllib.loads(path.read_text()).get("bots", [])
        examples = _example_bots(path)
        assert examples, f"{path.name}: no example bot"
        with switchboard_environment({}):
            settings = Settings(bots=[*shipped, *examples])
        assert open_webhooks(settings) == [], f"{path.name}: bots anyone could post to"
