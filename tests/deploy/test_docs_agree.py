"""The documents agree with each other and with what is shipped: the Kafka version Compose runs is
the one the README names as tested, the Kubernetes image is one the docs say how to build, and no
document points at an issue tracker instead of saying things itself."""

from __future__ import annotations

import re

from pipeline.embedded.apache_kafka import DEFAULT_KAFKA_VERSION
from tests.deploy.support import COMPOSE_FILE, K8S, OPERATIONS_DOC, ROOT, load_yaml
from tests.deploy.test_compose import services


def test_compose_runs_the_tested_kafka_version() -> None:
    image = services(load_yaml(COMPOSE_FILE))["kafka"]["image"]
    assert image == f"apache/kafka:{DEFAULT_KAFKA_VERSION}"
    assert f"Apache Kafka {DEFAULT_KAFKA_VERSION} (KRaft)" in (ROOT / "README.md").read_text()


def test_the_kubernetes_image_is_built_as_the_docs_say() -> None:
    image = load_yaml(K8S / "kustomization.yaml")["images"][0]
    assert image["name"] == "switchboard"
    operations = OPERATIONS_DOC.read_text()
    assert "docker build -t registry.example.com/switchboard:" in operations
    assert "kustomize edit set image switchboard=" in operations
    assert "docker build" in (K8S / "kustomization.yaml").read_text()


def test_no_document_cites_an_issue_number() -> None:
    documents = [*ROOT.glob("*.md"), *(ROOT / "docs").glob("*.md"), *(ROOT / "deploy").rglob("*.md")]
    documents += [*(ROOT / "deploy").rglob("*.toml"), *(ROOT / "deploy").rglob("*.yaml"), COMPOSE_FILE]
    cited = [
        f"{path.relative_to(ROOT)}: {match}"
        for path in documents
        for match in re.findall(r"(?i)issue\s*#\d+|issues/\d+", path.read_text(encoding="utf-8"))
    ]
    assert not cited
