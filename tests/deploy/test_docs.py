"""docs/operations.md: the metric table matches pipeline/metrics.py, so it cannot drift."""

from __future__ import annotations

import re

from tests.deploy.support import OPERATIONS_DOC, catalogue

HEADER = "| metric | type | labels | meaning |"


def metric_rows() -> dict[str, tuple[str, tuple[str, ...], str]]:
    """metric name → (type, labels, meaning) from the table under '## Metrics'."""
    text = OPERATIONS_DOC.read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    lines = section.splitlines()
    start = lines.index(HEADER)
    rows: dict[str, tuple[str, tuple[str, ...], str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"malformed row: {line}"
        name = cells[0].strip("`")
        labels = tuple(re.findall(r"`([^`]+)`", cells[2]))
        assert name not in rows, f"{name} listed twice"
        rows[name] = (cells[1], labels, cells[3])
    return rows


def test_table_lists_every_metric() -> None:
    rows = metric_rows()
    missing = sorted(set(catalogue()) - set(rows))
    unknown = sorted(set(rows) - set(catalogue()))
    assert not missing, f"metrics of pipeline/metrics.py missing from docs/operations.md: {missing}"
    assert not unknown, f"docs/operations.md lists metrics pipeline/metrics.py does not define: {unknown}"


def test_table_types_and_labels_match() -> None:
    rows = metric_rows()
    for name, metric in catalogue().items():
        kind, labels, meaning = rows[name]
        assert kind == metric.type, f"{name}: documented as {kind}, is a {metric.type}"
        assert labels == metric.labels, f"{name}: documented labels {labels}, has {metric.labels}"
        assert meaning, f"{name}: no meaning"


def test_table_follows_the_catalogue_order() -> None:
    assert list(metric_rows()) == list(catalogue())


def test_no_created_series_are_exposed() -> None:
    """docs/operations.md says `*_created` series are off: the exposition must agree."""
    from prometheus_client import generate_latest

    from pipeline import metrics

    metrics.WEBHOOKS.labels("console", "accepted").inc(0)
    metrics.END_TO_END.labels("console").observe(0.0)
    exposed = generate_latest().decode()
    assert "switchboard_webhooks_total{" in exposed and "switchboard_end_to_end_seconds_count{" in exposed
    names = {line.split("{")[0].split(" ")[0] for line in exposed.splitlines() if not line.startswith("#")}
    assert not [name for name in names if name.endswith("_created")]
