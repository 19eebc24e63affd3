"""What the deployment tests check against: the metric catalogue, the settings, PromQL, promtool."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import Counter, Gauge, Histogram, Info, Summary
from prometheus_client.metrics import MetricWrapperBase

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
PROMETHEUS_DIR = DEPLOY / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERTS_TEST = PROMETHEUS_DIR / "alerts.test.yml"
PROMETHEUS_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "switchboard.json"
K8S = DEPLOY / "k8s"
OPERATIONS_DOC = ROOT / "docs" / "operations.md"

#: how to get /usr/bin/promtool and /usr/bin/prometheus
PROMETHEUS_HINT = "Debian/Ubuntu: apt-get update && apt-get install -y prometheus"


# -- the metric catalogue -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    name: str  # exposed name of the family: counters with `_total`, histograms without a suffix
    type: str  # counter | gauge | histogram | summary | info
    labels: tuple[str, ...]
    help: str

    @property
    def series(self) -> set[str]:
        """Sample names Prometheus stores for this metric (no `_created`: pipeline/metrics.py disables it)."""
        if self.type == "counter":
            return {self.name}
        if self.type == "histogram":
            return {f"{self.name}_{s}" for s in ("bucket", "sum", "count")}
        if self.type == "summary":
            return {self.name, *(f"{self.name}_{s}" for s in ("sum", "count"))}
        if self.type == "info":
            return {self.name + "_info"}
        return {self.name}


@cache
def catalogue() -> dict[str, Metric]:
    """Every metric object defined in pipeline/metrics.py, by exposed name."""
    from pipeline import metrics

    kinds = {Counter: "counter", Gauge: "gauge", Histogram: "histogram", Summary: "summary", Info: "info"}
    out: dict[str, Metric] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        kind = next(k for cls, k in kinds.items() if isinstance(value, cls))
        name = value._name + "_total" if kind == "counter" else value._name  # noqa: SLF001
        out[name] = Metric(name, kind, tuple(value._labelnames), value._documentation)  # noqa: SLF001
    return out


@cache
def series_names() -> dict[str, Metric]:
    """Sample name → metric, for every sample name the worker can expose."""
    return {s: m for m in catalogue().values() for s in m.series}


#: series Prometheus itself attaches to every target
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_series_added"}
#: labels Prometheus adds to every scraped series (plus `le` on histogram buckets)
TARGET_LABELS = {"job", "instance"}


# -- settings -------------------------------------------------------------------------------------------
@cache
def setting_env_names() -> set[str]:
    """SWITCHBOARD_* names a deployment may set: one per Settings field, plus SWITCHBOARD_CONFIG (read by
    the TOML source in pipeline/settings.py)."""
    from pipeline.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    names = {prefix + field.upper() for field in Settings.model_fields}
    source = (ROOT / "pipeline" / "settings.py").read_text()
    names |= set(re.findall(r"os\.environ\.get\(\"(SWITCHBOARD_[A-Z0-9_]+)\"", source))
    return names


def bad_setting_names(names: set[str]) -> set[str]:
    """The SWITCHBOARD_* names among `names` that are not settings (nested `__` names: their root)."""
    valid = setting_env_names()
    return {n for n in names if n.startswith("SWITCHBOARD_") and n.split("__")[0] not in valid}


def settings_default(field: str) -> Any:
    from pipeline.settings import Settings

    return Settings.model_fields[field].default


# -- PromQL ---------------------------------------------------------------------------------------------
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atmodifier",
    "inf",
    "nan",
    "start",
    "end",
}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGE = re.compile(r"\[[^\]]*\]")
_DURATION = re.compile(r"\b\d+(?:ms|[smhdwy])\b")
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def grafana_to_promql(expr: str) -> str:
    """A Grafana target expression as plain PromQL (template variables replaced)."""
    expr = re.sub(r"\$__(rate_)?interval|\$__range", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (identifiers that are not functions, keywords or labels)."""
    text = _STRING.sub('""', expr)
    text = _SELECTOR.sub(lambda m: m.group(1) + " ", text)  # drop label matchers
    text = re.sub(r"\{[^}]*\}", " ", text)  # bare selectors {__name__=...}: not used here
    text = _GROUPING.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _DURATION.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue  # function or aggregation, or an operator keyword
        if re.fullmatch(r"[eE]\d*|0x[0-9a-fA-F]+", word):
            continue
        names.add(word)
    return names


def selector_labels(expr: str) -> list[tuple[str, set[str]]]:
    """(metric, label names used in its matchers) for each `metric{...}` selector."""
    text = _STRING.sub('""', expr)
    return [(m.group(1), set(_MATCHER.findall(m.group(2)))) for m in _SELECTOR.finditer(text)]


def check_expression(expr: str) -> list[str]:
    """Problems with an expression's metric names and selector labels (empty: fine)."""
    known = series_names()
    problems = []
    for name in sorted(metric_names(expr)):
        if name not in known and name not in SCRAPE_SERIES:
            problems.append(f"unknown metric {name!r}")
    for name, labels in selector_labels(expr):
        metric = known.get(name)
        if metric is None:
            continue
        allowed = set(metric.labels) | TARGET_LABELS | ({"le"} if name.endswith("_bucket") else set())
        extra = labels - allowed
        if extra:
            problems.append(f"{name} has no label(s) {sorted(extra)} (labels: {sorted(metric.labels)})")
    return problems


# -- tools ----------------------------------------------------------------------------------------------
def tool(name: str, install: str) -> str:
    """Path of an external binary, or skip the test saying how to install it."""
    path = shutil.which(name)
    for directory in ("/usr/bin", "/usr/sbin"):
        if path is None and Path(directory, name).exists():
            path = str(Path(directory, name))
    if path is None:
        pytest.skip(f"{name} not installed ({install})")
    return path


def promtool() -> str:
    return tool("promtool", PROMETHEUS_HINT)


def run(cmd: list[str], *, cwd: Path | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_yaml_all(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    slug = heading.strip().lower()
    slug = re.sub(r"[^\w\- ]", "", slug)
    return slug.replace(" ", "-")


def doc_anchors(path: Path) -> set[str]:
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", path.read_text(), re.M)}


@contextmanager
def switchboard_environment(env: dict[str, str]) -> Iterator[None]:
    """Exactly `env` as the SWITCHBOARD_* environment (the developer's own kept out)."""
    mp = pytest.MonkeyPatch()
    try:
        for key in [k for k in os.environ if k.startswith("SWITCHBOARD_")]:
            mp.delenv(key)
        for key, value in env.items():
            mp.setenv(key, value)
        yield
    finally:
        mp.undo()
