"""deploy/k8s: parses, kinds and apiVersions, probes on real paths, env vars are settings, labels
and selectors agree, replicas never above the partition count, KEDA on the right group and topics."""

from __future__ import annotations

import os
import tomllib
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import K8S, bad_setting_names, load_yaml, load_yaml_all, run, settings_default, tool

API_VERSIONS = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "Deployment": "apps/v1",
    "Job": "batch/v1",
    "PodDisruptionBudget": "policy/v1",
    "ScaledObject": "keda.sh/v1alpha1",
}
REQUIRED_KINDS = {"ConfigMap", "Secret", "Service", "Deployment", "Job", "PodDisruptionBudget", "ScaledObject"}

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization"
    out: list[Doc] = []
    for resource in kustomization["resources"]:
        path = K8S / resource
        assert path.is_file(), f"kustomization lists missing {resource}"
        out.extend(load_yaml_all(path))
    listed = {K8S / r for r in kustomization["resources"]}
    unlisted = [p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml" and p not in listed]
    assert not unlisted, f"manifests not in kustomization.yaml: {unlisted}"
    return out


def one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    return doc["spec"]["template"]["spec"]


def config_env(docs: list[Doc]) -> dict[str, str]:
    return {k: str(v) for k, v in one(docs, "ConfigMap", "switchboard-env")["data"].items()}


def partitions(docs: list[Doc]) -> int:
    return int(config_env(docs).get("SWITCHBOARD_PARTITIONS", settings_default("partitions")))


def test_kinds_and_api_versions(docs: list[Doc]) -> None:
    kinds = {d["kind"] for d in docs}
    assert REQUIRED_KINDS <= kinds
    for doc in docs:
        assert doc["apiVersion"] == API_VERSIONS[doc["kind"]], f"{doc['kind']}: {doc['apiVersion']}"
        assert doc["metadata"]["name"]
        assert "namespace" not in doc["metadata"], "the namespace comes from kustomization.yaml"


def test_env_names_are_settings(docs: list[Doc]) -> None:
    names = set(config_env(docs))
    names |= set(one(docs, "Secret", "switchboard-keys").get("stringData", {}))
    for doc in docs:
        if doc["kind"] in ("Deployment", "Job"):
            for container in pod_spec(doc)["containers"]:
                names |= {e["name"] for e in container.get("env", [])}
    assert all(n.startswith("SWITCHBOARD_") for n in config_env(docs)), "switchboard-env holds settings only"
    assert not bad_setting_names(names), "not fields of pipeline.settings.Settings"


def test_config_and_bots_make_valid_settings(docs: list[Doc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline.settings import Settings

    bots = one(docs, "ConfigMap", "switchboard-bots")["data"]
    (tmp_path / "switchboard.toml").write_text(bots["switchboard.toml"])
    tomllib.loads(bots["switchboard.toml"])
    for key in [k for k in os.environ if k.startswith("SWITCHBOARD_")]:
        monkeypatch.delenv(key)
    for key, value in config_env(docs).items():
        monkeypatch.setenv(key, value)
    for key, value in one(docs, "Secret", "switchboard-keys")["stringData"].items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(tmp_path / "switchboard.toml"))
    settings = Settings()
    assert settings.kafka_bootstrap and settings.redis_url and settings.metrics_token
    # No bot is shipped (the file shows an example): which surfaces they serve, test_surfaces.py.


def test_config_file_is_mounted_where_the_setting_says(docs: list[Doc]) -> None:
    config = Path(config_env(docs)["SWITCHBOARD_CONFIG"])
    for kind in ("Deployment", "Job"):
        spec = pod_spec(one(docs, kind))
        volumes = {v["name"]: v for v in spec["volumes"]}
        container = spec["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent))
        assert volumes[mount["name"]]["configMap"]["name"] == "switchboard-bots"
        assert {"configMapRef": {"name": "switchboard-env"}} in container["envFrom"]


def test_secret_refs_exist(docs: list[Doc]) -> None:
    secret = one(docs, "Secret", "switchboard-keys")
    for env in pod_spec(one(docs, "Deployment"))["containers"][0]["env"]:
        ref = env.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"]
            assert ref["key"] in secret["stringData"]
            assert ref["key"] == env["name"]


def test_worker_deployment(docs: list[Doc]) -> None:
    deployment = one(docs, "Deployment")
    spec = pod_spec(deployment)
    container = spec["containers"][0]
    assert container.get("args", ["worker"])[0] == "worker"
    port = int(config_env(docs).get("SWITCHBOARD_WEB_PORT", settings_default("web_port")))
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert named["http"] == port
    # Probes point at the worker's real endpoints (pipeline/web/server.py).
    paths = _served_paths()
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" in paths
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz" in paths
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in ("http", port)
    # Resources, non-root, graceful shutdown.
    assert container["resources"]["requests"]["cpu"] and container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    pre_stop = container["lifecycle"]["preStop"]
    assert pre_stop, "preStop lets endpoints drop the pod before SIGTERM"
    sleep = int(pre_stop["exec"]["command"][-1]) if "exec" in pre_stop else int(pre_stop["sleep"]["seconds"])
    grace = spec["terminationGracePeriodSeconds"]
    session_timeout = float(config_env(docs).get("SWITCHBOARD_KAFKA_SESSION_TIMEOUT_SECONDS", 10))
    assert grace >= sleep + 2 * session_timeout + 20, "grace must cover preStop, stop and leaving the group"
    if container["securityContext"].get("readOnlyRootFilesystem"):
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        datadir = next(e["value"] for e in container["env"] if e["name"] == "FAUST_DATADIR")
        assert datadir in mounts, "Faust writes its data dir at start"


def _served_paths() -> set[str]:
    """Paths the worker's web app routes (its router, built with dummy dependencies)."""
    from unittest.mock import MagicMock

    from pipeline.web.server import build_web_app

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # aiohttp's advice on the app's handlers and keys
        app = build_web_app(MagicMock())
    return {getattr(r.resource, "canonical", "") for r in app.router.routes()}


def test_labels_and_selectors_match(docs: list[Doc]) -> None:
    deployment = one(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in pod_spec(deployment)["containers"][0]["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in container_ports
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert "maxUnavailable" in pdb["spec"] or pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    # The Job's pods must not be selected by the worker Service/PDB.
    job_labels = one(docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= job_labels.items()


def test_topics_job(docs: list[Doc]) -> None:
    job = one(docs, "Job")
    spec = pod_spec(job)
    assert spec["restartPolicy"] in ("OnFailure", "Never")
    container = spec["containers"][0]
    assert container["args"] == ["topics", "apply"]
    assert container["image"] == pod_spec(one(docs, "Deployment"))["containers"][0]["image"]


def test_replicas_never_exceed_partitions(docs: list[Doc]) -> None:
    limit = partitions(docs)
    deployment = one(docs, "Deployment")
    assert 1 <= deployment["spec"]["replicas"] <= limit
    scaled = one(docs, "ScaledObject")
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"] <= limit
    assert scaled["spec"]["maxReplicaCount"] == limit, "cap at the partition count, not below it"


def test_keda_scales_the_workers_on_consumer_lag(docs: list[Doc]) -> None:
    from pipeline.settings import BotConfig
    from pipeline.topics import declarations

    env = config_env(docs)
    scaled = one(docs, "ScaledObject")
    deployment = one(docs, "Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    bots = tomllib.loads(one(docs, "ConfigMap", "switchboard-bots")["data"]["switchboard.toml"]).get("bots", [])
    platforms = sorted({BotConfig.model_validate(b).platform for b in bots})
    consumed = {d.name for d in declarations(platforms, partitions(docs)) if d.name != "im.deadletter"}
    triggers = scaled["spec"]["triggers"]
    assert triggers and all(t["type"] == "kafka" for t in triggers)
    topics = set()
    for trigger in triggers:
        meta = trigger["metadata"]
        assert meta["consumerGroup"] == env.get("SWITCHBOARD_APP_ID", settings_default("app_id"))
        assert meta["bootstrapServers"] == env["SWITCHBOARD_KAFKA_BOOTSTRAP"]
        assert int(meta["lagThreshold"]) > 0
        assert meta.get("allowIdleConsumers", "false") == "false"
        topics.add(meta["topic"])
    assert "session.input" in topics
    assert topics == consumed, f"one trigger per consumed topic: missing {consumed - topics}, extra {topics - consumed}"


def test_kustomize_renders(docs: list[Doc]) -> None:
    kubectl = tool("kubectl", "install kubectl (optional: renders the kustomization)")
    result = run([kubectl, "kustomize", str(K8S)])
    assert result.returncode == 0, result.stderr
    rendered = [d for d in yaml.safe_load_all(result.stdout) if d]
    assert len(rendered) == len(docs)
    namespace = load_yaml(K8S / "kustomization.yaml")["namespace"]
    for doc in rendered:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace
