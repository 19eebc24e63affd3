"""docker-compose.yml and the files it mounts, checked statically (no Docker engine needed)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipeline.state.redis_url import SentinelTarget, parse_redis_url
from tests.deploy.support import (
    COMPOSE_FILE,
    DEPLOY,
    DOCKERFILE,
    GRAFANA,
    ROOT,
    bad_setting_names,
    load_yaml,
    run,
    settings_default,
    switchboard_environment,
    tool,
)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = load_yaml(COMPOSE_FILE)
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def workers(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Services that run `switchboard worker` (the image's default command)."""
    return {
        name: svc
        for name, svc in services(compose).items()
        if svc.get("image", "").startswith("switchboard") and svc.get("command", ["worker"])[0] == "worker"
    }


def env_of(svc: dict[str, Any]) -> dict[str, str]:
    """A service's environment as written; a variable without a value (passed on from .env or the
    shell only when set there) is left out, as Compose leaves it out when it is not set."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env if "=" in item)
    return {k: str(v) for k, v in env.items() if v is not None}


def passed_on(svc: dict[str, Any]) -> set[str]:
    """The variables a service takes from .env or the shell as they are (written without a value)."""
    env = svc.get("environment") or {}
    if isinstance(env, list):
        return {item for item in env if "=" not in item}
    return {k for k, v in env.items() if v is None}


# What a .env for Ark holds (docker-compose.yml's header): the values the tests give Compose.
ARK_DOTENV = {
    "SWITCHBOARD_SESSION_BASE_URL": "https://ark.cn-beijing.volces.com/api/v3",
    "SWITCHBOARD_SESSION_PROFILE": "ark",
    "SWITCHBOARD_SESSION_API_KEY": "session-key-from-dotenv",
}


def dockerfile_env() -> dict[str, str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"([A-Z_][A-Z0-9_]*)=(\S+)", line)))
    return env


def web_port(svc: dict[str, Any]) -> int:
    """The port the worker listens on: its SWITCHBOARD_WEB_PORT (compose, else the image, else the default)."""
    value = env_of(svc).get("SWITCHBOARD_WEB_PORT") or dockerfile_env().get("SWITCHBOARD_WEB_PORT")
    return int(value) if value else int(settings_default("web_port"))


def container_port(mapping: str | int | dict[str, Any]) -> int:
    if isinstance(mapping, dict):
        return int(mapping["target"])
    return int(str(mapping).split(":")[-1].split("/")[0])


def interpolated(value: str) -> str:
    """A value as Compose sees it without a .env file: `${X:-default}` → default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def bind_mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for volume in svc.get("volumes", []):
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                out.append((volume["source"], volume["target"]))
            continue
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            out.append((source, target))
    return out


def test_expected_services(compose: dict[str, Any]) -> None:
    names = set(services(compose))
    assert {"kafka", "redis", "topics-init", "proxy", "sim", "prometheus", "grafana"} <= names
    assert len(workers(compose)) >= 2, "two or more workers behind the proxy"
    assert services(compose)["sim"].get("profiles") == ["sim"], "the simulator is an optional profile"
    sentinel = {"redis-replica", "sentinel-1", "sentinel-2", "sentinel-3"}
    for name, svc in services(compose).items():
        if name in sentinel:
            assert svc.get("profiles") == ["sentinel"], f"{name} is part of the optional sentinel profile"
        elif name != "sim":
            assert not svc.get("profiles"), f"{name} should start without a profile"


def test_the_sentinel_profile_replicates_redis_and_is_internal(compose: dict[str, Any]) -> None:
    """`--profile sentinel`: a replica of `redis`, three sentinels (quorum 2) watching it, none
    published; the URL the file documents for .env names exactly them."""
    svcs = services(compose)
    replica = svcs["redis-replica"]["command"]
    assert replica[replica.index("--replicaof") + 1 : replica.index("--replicaof") + 3] == ["redis", "6379"]
    assert "--appendonly" in replica
    sentinels = [name for name in svcs if name.startswith("sentinel-")]
    assert len(sentinels) == 3
    for name in ("redis", "redis-replica"):  # both start in the role the sentinels give them
        command, env = svcs[name]["command"], env_of(svcs[name])
        assert command[:4] == ["sh", "/usr/local/bin/start-server.sh", "docker-entrypoint.sh", "redis-server"], name
        assert ("./deploy/redis/start-server.sh", "/usr/local/bin/start-server.sh") in bind_mounts(svcs[name])
        assert env["REDIS_NAME"] == name, f"{name} must compare itself with the sentinels' answer by its name"
        assert env["REDIS_SENTINELS"].split() == [f"{sentinel}:26379" for sentinel in sentinels], name
    for name in sentinels:
        svc = svcs[name]
        script = svc["command"][-1]
        assert "sentinel monitor switchboard redis 6379 2" in script
        assert script.rstrip().endswith("--sentinel")
        assert svc["hostname"] == name and not svc.get("ports"), f"{name} must stay internal"
        assert any(v.endswith(":/data") for v in svc["volumes"]), f"{name} keeps what it learned"
    documented = next(
        line.split("SWITCHBOARD_REDIS_URL=", 1)[1].strip()
        for line in COMPOSE_FILE.read_text().splitlines()
        if "SWITCHBOARD_REDIS_URL=redis+sentinel://" in line
    )
    target = parse_redis_url(documented)
    assert isinstance(target, SentinelTarget) and target.master == "switchboard"
    assert {host for host, port in target.sentinels} == set(sentinels)
    worker = next(iter(workers(compose).values()))
    assert env_of(worker)["SWITCHBOARD_REDIS_URL"] == "${SWITCHBOARD_REDIS_URL:-redis://redis:6379/0}"


def test_kafka_is_kraft_with_a_persistent_volume(compose: dict[str, Any]) -> None:
    kafka = services(compose)["kafka"]
    assert kafka["image"].startswith("apache/kafka:") and not kafka["image"].endswith(":latest")
    env = env_of(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}, "KRaft, no ZooKeeper"
    assert "ZOOKEEPER" not in " ".join(env)
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] in env["KAFKA_LISTENERS"]
    log_dir = env["KAFKA_LOG_DIRS"]
    named = {v.split(":")[0]: v.split(":")[1] for v in kafka["volumes"] if not v.startswith((".", "/"))}
    assert log_dir in named.values(), "the log dir must be on a named volume"
    assert set(named) <= set(compose["volumes"])
    assert "healthcheck" in kafka


def test_redis_has_aof_on_a_volume(compose: dict[str, Any]) -> None:
    redis = services(compose)["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    volume = next(v for v in redis["volumes"] if v.endswith(":/data"))
    assert volume.split(":")[0] in compose["volumes"]
    assert "healthcheck" in redis


def test_topics_are_applied_before_workers_start(compose: dict[str, Any]) -> None:
    init = services(compose)["topics-init"]
    assert init["command"] == ["topics", "apply"]
    assert init["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert env_of(init)["SWITCHBOARD_CONFIG"], "topics-init needs the bots file to know the platforms"
    for name, svc in workers(compose).items():
        assert svc["depends_on"]["topics-init"]["condition"] == "service_completed_successfully", name
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy", name
        # The same settings as topics-init: the same partitions and platforms.
        assert env_of(svc) == env_of(init), f"{name} and topics-init disagree on settings"


def test_every_switchboard_variable_is_a_setting(compose: dict[str, Any]) -> None:
    used: set[str] = set()
    for svc in services(compose).values():
        used |= set(env_of(svc))
    used |= set(re.findall(r"\$\{(SWITCHBOARD_[A-Z0-9_]+)", COMPOSE_FILE.read_text()))
    assert any(n.startswith("SWITCHBOARD_") for n in used)
    assert not bad_setting_names(used), "not fields of pipeline.settings.Settings"


def test_worker_settings_validate() -> None:
    """The workers' environment (defaults interpolated, the required secrets given as in .env) and
    bots file make valid Settings. (Which surfaces they serve: test_surfaces.py.)"""
    from pipeline.settings import Settings

    worker = next(iter(workers(load_yaml(COMPOSE_FILE)).values()))
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", COMPOSE_FILE.read_text()))
    env = {k: interpolated(v) for k, v in env_of(worker).items()}
    env.update({k: ARK_DOTENV.get(k, "from-dotenv") for k in required if k in env})
    config = env.pop("SWITCHBOARD_CONFIG")
    source, target = next((s, t) for s, t in bind_mounts(worker) if config.startswith(t))
    bots_file = ROOT / source / Path(config).relative_to(target) if Path(source).is_dir() else ROOT / source
    with switchboard_environment({**env, "SWITCHBOARD_CONFIG": str(bots_file)}):
        settings = Settings()
    assert settings.kafka_bootstrap and settings.redis_url
    assert settings.metrics_token is not None and settings.metrics_token.get_secret_value() == "from-dotenv"
    # What a provisioner needs is passed on when .env sets it.
    assert {"SWITCHBOARD_SESSION_AGENT_ID", "SWITCHBOARD_ARK_ACCESS_KEY", "SWITCHBOARD_ARK_SECRET_KEY"} <= passed_on(
        worker
    )


def test_worker_ports_map_to_the_web_port(compose: dict[str, Any]) -> None:
    for name, svc in workers(compose).items():
        port = web_port(svc)
        assert env_of(svc).get("SWITCHBOARD_WEB_HOST") == "0.0.0.0" or "SWITCHBOARD_WEB_HOST=0.0.0.0" in (
            DOCKERFILE.read_text()
        ), f"{name} must listen beyond loopback"
        for mapping in svc.get("ports", []):
            assert container_port(mapping) == port, f"{name}: {mapping} does not reach port {port}"
        for exposed in svc.get("expose", []):
            assert int(exposed) == port, name


def test_referenced_files_exist(compose: dict[str, Any]) -> None:
    for name, svc in services(compose).items():
        for source, _ in bind_mounts(svc):
            assert (ROOT / source).exists(), f"{name} mounts missing {source}"
        build = svc.get("build")
        if build is not None:
            context = ROOT / (build if isinstance(build, str) else build.get("context", "."))
            dockerfile = "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
            assert (context / dockerfile).is_file(), name
    images = {svc.get("image") for svc in services(compose).values() if svc.get("build")}
    for name, svc in services(compose).items():
        if svc.get("image", "").startswith("switchboard"):
            assert svc["image"] in images, f"{name} uses an image no service builds"


def test_sim_is_where_the_workers_look_for_it(compose: dict[str, Any]) -> None:
    sim = services(compose)["sim"]
    command = sim["command"]
    port = command[command.index("--port") + 1]
    assert command[command.index("--host") + 1] == "0.0.0.0"
    key = command[command.index("--api-key") + 1]
    header = (ROOT / "docker-compose.yml").read_text()
    # The lines the file tells you to put in .env for the simulator point at it.
    assert f"#   SWITCHBOARD_SESSION_BASE_URL=http://sim:{port}/v1\n" in header
    assert f"#   SWITCHBOARD_SESSION_API_KEY={key}\n" in header
    for name, svc in workers(compose).items():
        env = env_of(svc)
        # No silent fallback to the simulator: the session API is named, or Compose refuses.
        for variable in ("SWITCHBOARD_SESSION_BASE_URL", "SWITCHBOARD_SESSION_PROFILE", "SWITCHBOARD_SESSION_API_KEY"):
            assert str(env[variable]).startswith(f"${{{variable}:?"), (name, variable, env[variable])
        assert not any("sim:" in str(value) for value in env.values() if value is not None), name
        assert svc["depends_on"]["sim"]["required"] is False, "workers must start without the sim profile"
    # The image's HEALTHCHECK probes the worker port; the sim needs its own.
    assert "8787" in " ".join(sim["healthcheck"]["test"])


# -- the proxy --------------------------------------------------------------------------------------------
def haproxy_config(compose: dict[str, Any]) -> tuple[Path, str]:
    proxy = services(compose)["proxy"]
    source = next(s for s, t in bind_mounts(proxy) if t.endswith("haproxy.cfg"))
    path = ROOT / source
    return path, path.read_text()


def test_proxy_balances_over_every_worker(compose: dict[str, Any]) -> None:
    path, cfg = haproxy_config(compose)
    assert path.is_relative_to(DEPLOY)
    servers = dict(re.findall(r"^\s*server\s+\S+\s+([\w.-]+):(\d+)", cfg, re.M))
    expected = {name: str(web_port(svc)) for name, svc in workers(compose).items()}
    assert servers == expected, "haproxy backends must be exactly the worker services and their web ports"
    assert re.search(r"^\s*balance\s+roundrobin", cfg, re.M)
    assert re.search(r"option httpchk GET /readyz", cfg), "only ready workers take webhooks"
    bind = int(re.search(r"^\s*bind\s+\S*:(\d+)", cfg, re.M).group(1))  # type: ignore[union-attr]
    assert {container_port(p) for p in services(compose)["proxy"]["ports"]} == {bind}
    assert set(services(compose)["proxy"]["depends_on"]) == set(workers(compose))


def test_haproxy_accepts_the_config(compose: dict[str, Any]) -> None:
    # `haproxy -c` parses the mounted file as the proxy container's haproxy does when it starts,
    # without serving. The binary comes from the Debian/Ubuntu package `haproxy` (system-deps).
    haproxy = tool(
        "haproxy",
        "needed to run `haproxy -c -f deploy/haproxy/haproxy.cfg`; install the Debian/Ubuntu package "
        "`haproxy`: `apt-get install -y haproxy`, or `make system-deps` as root",
    )
    path, _ = haproxy_config(compose)
    result = run([haproxy, "-c", "-f", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


# -- Prometheus and Grafana -------------------------------------------------------------------------------
def test_prometheus_scrapes_every_worker(compose: dict[str, Any]) -> None:
    prometheus = services(compose)["prometheus"]
    mounts = dict(bind_mounts(prometheus))
    config_source = next(s for s, t in mounts.items() if t.endswith("/prometheus.yml"))
    config_target = mounts[config_source]
    config = load_yaml(ROOT / config_source)
    job = next(j for j in config["scrape_configs"] if j["job_name"] == "switchboard")
    targets = {t for sc in job["static_configs"] for t in sc["targets"]}
    expected = {f"{name}:{web_port(svc)}" for name, svc in workers(compose).items()}
    assert targets == expected, "scrape targets must be the worker services on their web ports"
    assert job.get("metrics_path", "/metrics") == "/metrics"
    # Rule files resolve next to the config inside the container, and are mounted there.
    config_dir = Path(config_target).parent
    for rule_file in config["rule_files"]:
        target = str(config_dir / rule_file)
        assert target in mounts.values(), f"{rule_file} is not mounted at {target}"
        source = next(s for s, t in mounts.items() if t == target)
        assert (ROOT / source).resolve() == (ROOT / config_source).parent.joinpath(rule_file).resolve()
    assert f"--config.file={config_target}" in prometheus.get("command", [f"--config.file={config_target}"])


def test_grafana_is_provisioned(compose: dict[str, Any]) -> None:
    grafana = services(compose)["grafana"]
    mounts = dict(bind_mounts(grafana))
    assert mounts.get("./deploy/grafana/provisioning") == "/etc/grafana/provisioning"
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    prom = next(d for d in datasources if d["type"] == "prometheus")
    port = next(container_port(p) for p in services(compose)["prometheus"]["ports"])
    assert prom["url"] == f"http://prometheus:{port}"
    providers = load_yaml(GRAFANA / "provisioning" / "dashboards" / "switchboard.yml")["providers"]
    dashboard_dir = providers[0]["options"]["path"]
    source = next(s for s, t in mounts.items() if t == dashboard_dir)
    assert list((ROOT / source).glob("*.json")), "no dashboard in the provisioned directory"
    home = env_of(grafana).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        assert (ROOT / source / Path(home).relative_to(dashboard_dir)).is_file(), home
