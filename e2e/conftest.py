"""End-to-end tests against a real Kubernetes cluster: part of `make test`, skipped without one.

They run (also alone, as ``pytest e2e``) when all of these are set; else every test is skipped,
saying which one is missing:

* ``KUBECONFIG``: the cluster (kind, k3d, a test cluster);
* ``KGO_E2E_IMAGE``: the operator image, pullable by the cluster (it also runs the example
  consumers), e.g. ``ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0``;
* ``KGO_E2E_BOOTSTRAP``: Kafka bootstrap servers reachable from the cluster's pods and from
  this machine (the tests create their topic through it).

helm and kubectl come from ``make install`` (``.tools/``) or the PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("KUBECONFIG", "KGO_E2E_IMAGE", "KGO_E2E_BOOTSTRAP")
RELEASE = "kgo"
# The chart's names for release "kgo": the operator's StatefulSet, Service and ServiceAccount.
OPERATOR = f"{RELEASE}-kafka-group-operator"
OPERATOR_SELECTOR = (
    f"app.kubernetes.io/name=kafka-group-operator,app.kubernetes.io/instance={RELEASE}"
)
# Every wait has its own bound; a test's timeout must exceed the sum of those it may meet.
HELM_WAIT_S = 300
WAIT_S = 300
SLACK_S = 120


def budget(waits: int, polls_s: float = 0) -> pytest.MarkDecorator:
    """A test's timeout: the chart's install and uninstall (the first and the last test pay
    for the session fixture), ``waits`` bounded waits of ``WAIT_S``, ``polls_s`` seconds of
    polling, and slack."""
    return pytest.mark.timeout(2 * HELM_WAIT_S + waits * WAIT_S + polls_s + SLACK_S)


def tool(name: str) -> str:
    local = ROOT / ".tools" / name / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: run `make install`")
    return found


def run(*args: str, stdin: str | None = None, timeout: float = WAIT_S + 60) -> str:
    """Run helm or kubectl; fail the test with its output when it fails.

    ``timeout`` must exceed the command's own (``--timeout``, ``--wait``) so that it reports.
    """
    command = [tool(args[0]), *args[1:]]
    result = subprocess.run(
        command, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def attempt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm or kubectl whose failure is an answer (``auth can-i``, a refused apply)."""
    return subprocess.run(
        [tool(args[0]), *args[1:]],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=WAIT_S + 60,
        check=False,
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing:
        reason = (
            f"e2e needs a real cluster: set {', '.join(missing)} "
            "(see e2e/conftest.py); nothing here runs against a mock"
        )
        # pytest hands every collected item to every conftest's hook: mark only our own.
        here = Path(__file__).resolve().parent
        for item in items:
            if here in Path(str(item.path)).resolve().parents:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def namespace() -> Iterator[str]:
    name = f"kgo-e2e-{uuid.uuid4().hex[:6]}"
    run("kubectl", "create", "namespace", name)
    yield name
    run("kubectl", "delete", "namespace", name, "--wait=false")


@pytest.fixture(scope="session")
def operator(namespace: str) -> Iterator[str]:
    """The chart installed into ``namespace``, watching that namespace only."""
    image = os.environ["KGO_E2E_IMAGE"]
    repository, _, tag = image.rpartition(":")
    release = RELEASE
    run(
        "helm", "install", release, str(ROOT / "charts" / "kafka-group-operator"),
        "--namespace", namespace,
        "--set", f"kafka.bootstrapServers={os.environ['KGO_E2E_BOOTSTRAP']}",
        # The test cluster's Kafka has one broker.
        "--set", "stateTopic.replicationFactor=1",
        "--set", "stateTopic.minInsyncReplicas=1",
        "--set", "image.registry=",
        "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}",
        "--set", f"watchNamespaces={{{namespace}}}",
        "--set", "statusIntervalSeconds=2",
        "--wait", "--timeout", f"{HELM_WAIT_S}s",
        timeout=HELM_WAIT_S + 60,
    )  # fmt: skip
    yield release
    run(
        "helm", "uninstall", release, "--namespace", namespace,
        "--wait", "--timeout", f"{HELM_WAIT_S}s",
        timeout=HELM_WAIT_S + 60,
    )  # fmt: skip
