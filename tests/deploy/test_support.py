"""The checkers the deployment tests rely on catch what they are meant to catch."""

from __future__ import annotations

from tests.deploy.support import (
    bad_setting_names,
    catalogue,
    check_expression,
    grafana_to_promql,
    metric_names,
    series_names,
)


def test_catalogue_reads_pipeline_metrics() -> None:
    metrics = catalogue()
    assert metrics["switchboard_egress_total"].type == "counter"
    assert metrics["switchboard_egress_total"].labels == ("platform", "outcome")
    assert metrics["switchboard_end_to_end_seconds"].type == "histogram"
    assert "switchboard_end_to_end_seconds_bucket" in series_names()
    assert "switchboard_egress" not in series_names(), "counters are stored with _total"


def test_metric_names_skip_functions_keywords_and_labels() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (platform, le) (rate(switchboard_end_to_end_seconds_bucket"
        '{platform=~"tele.*", le!="1e3"}[5m]))) > 1e3 and on (platform) '
        'sum without (instance) (switchboard_consumer_lag offset 10m) or absent(up{job="switchboard"})'
    )
    assert metric_names(expr) == {"switchboard_end_to_end_seconds_bucket", "switchboard_consumer_lag", "up"}


def test_check_expression_reports_unknown_metrics_and_labels() -> None:
    assert check_expression("rate(switchboard_egress_total[5m])") == []
    assert check_expression("rate(switchboard_egress[5m])") == ["unknown metric 'switchboard_egress'"]
    assert check_expression("switchboard_egress_total_bucket") != []
    assert check_expression('rate(switchboard_egress_total{stage="x"}[5m])') != []
    assert check_expression('rate(switchboard_end_to_end_seconds_bucket{le="1", instance="a"}[5m])') == []


def test_grafana_variables_become_promql() -> None:
    expr = grafana_to_promql('rate(switchboard_egress_total{instance=~"$instance"}[$__rate_interval])')
    assert expr == 'rate(switchboard_egress_total{instance=~".*"}[5m])'


def test_setting_names() -> None:
    assert not bad_setting_names({"SWITCHBOARD_KAFKA_BOOTSTRAP", "SWITCHBOARD_CONFIG", "SWITCHBOARD_WEB_PORT"})
    assert bad_setting_names({"SWITCHBOARD_KAFKA_BROKERS"}) == {"SWITCHBOARD_KAFKA_BROKERS"}
    assert not bad_setting_names({"FAUST_DATADIR", "KAFKA_NODE_ID"}), "only SWITCHBOARD_* names are settings"
