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
