"""The Grafana dashboard and provisioning: valid JSON, only catalogued metrics, PromQL that parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.support import (
    DASHBOARD,
    GRAFANA,
    catalogue,
    check_expression,
    grafana_to_promql,
    load_yaml,
    metric_names,
    promtool,
    run,
)


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dash["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))  # collapsed rows
    return out


def exprs() -> list[tuple[str, str]]:
    """(panel title / refId, expression) of every query."""
    return [
        (f"{p['title']} / {t['refId']}", t["expr"])
        for p in panels(dashboard())
        for t in p.get("targets", [])
        if "expr" in t
    ]


def test_dashboard_is_valid_and_unique() -> None:
    dash = dashboard()
    assert dash["uid"] and dash["title"]
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dash):
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            refs = [t["refId"] for t in panel["targets"]]
            assert len(refs) == len(set(refs)), panel["title"]
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]


def test_dashboard_uses_the_provisioned_datasource() -> None:
    sources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    uids = {s["uid"] for s in sources if s["type"] == "prometheus"}
    for panel in panels(dashboard()):
        for item in [panel, *panel.get("targets", [])]:
            if "datasource" in item:
                assert item["datasource"] == {"type": "prometheus", "uid": next(iter(uids))}, panel["title"]


def test_dashboard_provider_points_at_the_dashboards() -> None:
    provider = load_yaml(GRAFANA / "provisioning" / "dashboards" / "switchboard.yml")["providers"][0]
    assert provider["type"] == "file"
    assert Path(provider["options"]["path"]).name == DASHBOARD.parent.name


@pytest.mark.parametrize(("where", "expr"), exprs())
def test_expression_uses_only_catalogued_metrics(where: str, expr: str) -> None:
    promql = grafana_to_promql(expr)
    assert metric_names(promql), f"{where}: no metric in {expr!r}"
    assert check_expression(promql) == [], where


def test_dashboard_covers_the_catalogue() -> None:
    """Throughput, latency, lag, errors, egress, tokens, streams, executor: every metric has a panel."""
    used = set().union(*(metric_names(grafana_to_promql(e)) for _, e in exprs()))
    covered = {m.name for m in catalogue().values() if m.series & used}
    assert covered == set(catalogue()), f"metrics without a panel: {sorted(set(catalogue()) - covered)}"
    histograms = {m.name for m in catalogue().values() if m.type == "histogram"}
    quantiles = [e for _, e in exprs() if "histogram_quantile" in e]
    for name in histograms:
        assert any(f"{name}_bucket" in e for e in quantiles), f"no percentile panel for {name}"


def test_expressions_parse(tmp_path: Path) -> None:
    """promtool parses every expression (as recording rules of a temporary rules file)."""
    tool = promtool()
    rules = [{"record": f"dashboard:expr_{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(exprs())]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([tool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
