"""Prometheus config and alert rules: promtool checks and unit tests, metric names against the catalogue,
a runbook for every alert."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    ALERTS,
    ALERTS_TEST,
    OPERATIONS_DOC,
    PROMETHEUS_CONFIG,
    PROMETHEUS_DIR,
    check_expression,
    doc_anchors,
    load_yaml,
    metric_names,
    promtool,
    run,
)

#: what the alert rules must cover (issue "Operations", part 2)
REQUIRED_ALERTS = {
    "SwitchboardConsumerLagGrowing": "switchboard_consumer_lag",
    "SwitchboardDeadLetters": "switchboard_dead_letters_total",
    "SwitchboardEndToEndLatencyHigh": "switchboard_end_to_end_seconds_bucket",
    "SwitchboardSegmentsFailureRatio": "switchboard_segments_total",
    "SwitchboardSessionErrorRatio": "switchboard_session_errors_total",
    "SwitchboardEgressRateLimitStorm": "switchboard_egress_total",
    "SwitchboardSseReconnectStorm": "switchboard_sse_reconnects_total",
    "SwitchboardWorkerDown": "up",
    "SwitchboardConnectionUnheld": "switchboard_connection_holder_missing",
}


def rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def test_required_alerts_exist() -> None:
    found = alerts()
    for name, metric in REQUIRED_ALERTS.items():
        assert name in found, f"missing alert {name}"
        assert metric in metric_names(found[name]["expr"]), f"{name} should watch {metric}"
    assert 'outcome="rate_limited"' in found["SwitchboardEgressRateLimitStorm"]["expr"]
    assert found["SwitchboardWorkerDown"]["expr"].replace(" ", "").startswith('up{job="switchboard"}==0')


@pytest.mark.parametrize("name", sorted(alerts()))
def test_alert_uses_only_catalogued_metrics(name: str) -> None:
    expr = alerts()[name]["expr"]
    assert metric_names(expr), f"{name}: no metric found in {expr!r}"
    assert check_expression(expr) == []


@pytest.mark.parametrize("name", sorted(alerts()))
def test_alert_has_a_runbook(name: str) -> None:
    rule = alerts()[name]
    annotations = rule.get("annotations", {})
    assert annotations.get("summary"), f"{name}: no summary"
    assert rule.get("labels", {}).get("severity") in {"warning", "critical"}
    runbook = annotations.get("runbook", "")
    path, _, anchor = runbook.partition("#")
    assert path == "docs/operations.md" and anchor, f"{name}: runbook {runbook!r}"
    assert anchor == name.lower(), f"{name}: runbook anchor should be #{name.lower()}"
    assert anchor in doc_anchors(OPERATIONS_DOC), f"{name}: no '### {name}' section in docs/operations.md"


def test_alerts_select_the_scrape_job() -> None:
    """`job="..."` in the rules is the job that scrapes the workers in prometheus.yml."""
    jobs = {j["job_name"] for j in load_yaml(PROMETHEUS_CONFIG)["scrape_configs"]}
    for name, rule in alerts().items():
        for job in re.findall(r'job\s*=\s*"([^"]+)"', rule["expr"]):
            assert job in jobs, f"{name}: no scrape job {job!r} in prometheus.yml"
    assert "switchboard" in jobs


def test_every_alert_is_unit_tested() -> None:
    tests = load_yaml(ALERTS_TEST)
    assert tests["rule_files"] == [ALERTS.name]
    tested = {case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", [])}
    firing = {
        case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", []) if case.get("exp_alerts")
    }
    quiet = {
        case["alertname"] for t in tests["tests"] for case in t.get("alert_rule_test", []) if not case.get("exp_alerts")
    }
    assert tested == set(alerts())
    assert firing == set(alerts()), f"never shown firing: {set(alerts()) - firing}"
    assert quiet == set(alerts()), f"never shown quiet: {set(alerts()) - quiet}"


def test_unit_test_series_are_catalogued() -> None:
    for t in load_yaml(ALERTS_TEST)["tests"]:
        for series in t["input_series"]:
            assert check_expression(series["series"]) == [], series["series"]


def test_promtool_check_rules() -> None:
    result = run([promtool(), "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config(tmp_path: Path) -> None:
    """The shipped config, with its credential files (compose secrets) as local files."""
    config = load_yaml(PROMETHEUS_CONFIG)
    for job in config["scrape_configs"]:
        auth = job.get("authorization") or {}
        if "credentials_file" in auth:
            secret = tmp_path / Path(auth["credentials_file"]).name
            secret.write_text("a-token")
            auth["credentials_file"] = str(secret)
    for rule_file in config.get("rule_files", []):
        shutil.copy(PROMETHEUS_CONFIG.parent / rule_file, tmp_path / rule_file)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = run([promtool(), "check", "config", str(tmp_path / "prometheus.yml")])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    result = run([promtool(), "test", "rules", ALERTS_TEST.name], cwd=PROMETHEUS_DIR)
    assert result.returncode == 0, result.stdout + result.stderr
