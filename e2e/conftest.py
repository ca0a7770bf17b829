"""End-to-end tests on a real Kubernetes control plane: part of `make test`.

The session starts, on loopback (``e2e/support``):

* etcd (Debian's ``etcd-server``) and kube-apiserver, kube-controller-manager and
  kube-scheduler built from ``k8s.io/kubernetes`` (``e2e/controlplane/build.sh``, cached by
  release): RBAC, a static admin token, ServiceAccount tokens, OwnerReferencesPermissionEnforcement;
* a node of our own that runs the pods bound to it as local processes (``support/node.py``):
  the operator's three replicas with their ServiceAccount's token, the consumers, the gateway
  sidecars, each on a loopback address of its own, Services resolved as cluster DNS would;
* an Apache Kafka node (the reference broker, ``embedded/kafka.py``: its jars fetched once).

Then the chart is installed with its defaults (``kafka.bootstrapServers`` and the state
topic's replication, for one broker, aside). helm and
kubectl come from ``make install`` (``.tools/``). Every wait follows a condition; its bound
(``WAIT_S``) only turns "never" into a failure with the state that was reached.

Needs Linux, root (or unprivileged user namespaces), gcc, etcd and Go (see ``.ci/run``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.hang_guard import (  # noqa: F401  (hooks)
    pytest_runtest_protocol,
    pytest_unconfigure,
)

from e2e.support import controlplane, node
from kafka_group_operator.embedded import kafka

ROOT = Path(__file__).resolve().parents[1]
RELEASE = "kgo"
# The chart's names for release "kgo": the operator's StatefulSet, Service and ServiceAccount.
OPERATOR = f"{RELEASE}-kafka-group-operator"
OPERATOR_SELECTOR = (
    f"app.kubernetes.io/name=kafka-group-operator,app.kubernetes.io/instance={RELEASE}"
)
OPERATOR_NAMESPACE = "kgo-system"
# Every wait has its own bound; a test's timeout must exceed the sum of those it may meet.
CLUSTER_START_S = 900
HELM_WAIT_S = 300
KAFKA_START_S = 300
WAIT_S = 300
SLACK_S = 120


def budget(waits: int, polls_s: float = 0) -> pytest.MarkDecorator:
    """A test's timeout: the session fixtures (the cluster's start, the chart's install and
    uninstall: the first and the last test pay for them), ``waits`` bounded waits of
    ``WAIT_S``, ``polls_s`` seconds of polling, and slack."""
    return pytest.mark.timeout(
        CLUSTER_START_S + 2 * HELM_WAIT_S + waits * WAIT_S + polls_s + SLACK_S
    )


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


def get(kind: str, name: str, namespace: str) -> dict[str, Any]:
    out = run("kubectl", "get", kind, name, "-n", namespace, "-o", "json")
    found: dict[str, Any] = json.loads(out)
    return found


def wait_for(predicate: Any, what: str, within: float = WAIT_S, every: float = 1.0) -> Any:
    """Poll ``predicate`` until it returns something truthy; that value."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {within:.0f} s"
        time.sleep(every)


# ----------------------------------------------------------------------------- scheduling


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With ``--dist loadfile``, every e2e file goes to the same worker: one cluster."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class OneCluster(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("e2e/"):
                return "e2e"
            scope: str = super()._split_scope(nodeid)
            return scope

    return OneCluster(config, log)


# ----------------------------------------------------------------------------- the cluster


def podnet_library() -> Path:
    """``podnet.so``, compiled once per source (it is small) into the cache."""
    source = ROOT / "e2e" / "support" / "podnet.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    library = cache / "kafka-group-operator" / f"podnet-{digest}" / "podnet.so"
    if library.exists():
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.fail("a C compiler is required for e2e/support/podnet.c (apt-get install gcc)")
    library.parent.mkdir(parents=True, exist_ok=True)
    partial = library.with_suffix(f".{os.getpid()}")
    done = subprocess.run(
        [compiler, "-O2", "-Wall", "-shared", "-fPIC", "-o", str(partial), str(source), "-ldl"],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"compiling podnet.c failed:\n{done.stderr}")
    partial.replace(library)
    return library


def _free_subnet() -> int:
    """A second octet no loopback socket uses: this node's pods live in 127.<it>.0.0/16."""
    used = set()
    for table in ("/proc/net/tcp", "/proc/net/udp"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                address = int(line.split()[1].split(":")[0], 16)
                used.add((address >> 8) & 0xFF)  # little-endian: 127.S.x.y
    free = [s for s in range(16, 251) if s not in used]
    return random.choice(free)


@dataclass
class Cluster:
    """The control plane, the node and the broker of the session."""

    control_plane: controlplane.ControlPlane
    state_dir: Path
    bootstrap: str
    node_name: str
    node_process: subprocess.Popen[bytes]

    def pod_dir(self, namespace: str, pod: str) -> Path:
        uid = get("pod", pod, namespace)["metadata"]["uid"]
        return self.state_dir / "pods" / f"{namespace}_{pod}_{uid}"

    def exec_in(
        self, namespace: str, pod: str, container: str, *argv: str, timeout: float = WAIT_S
    ) -> subprocess.CompletedProcess[str]:
        """``argv`` in a container's context (its environment, address and mounts), as
        ``kubectl exec`` would run it."""
        spec = self.pod_dir(namespace, pod) / "containers" / container / "launch.json"
        launched = json.loads(spec.read_text())
        program = shutil.which(argv[0], path=launched["env"]["PATH"]) or argv[0]
        return subprocess.run(
            [*node.launcher_command(spec), program, *argv[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def client_env(self) -> dict[str, str]:
        """The environment of a process on this machine that is a client of the cluster: the
        cluster's names resolve (``podnet.so`` without a pod address of its own)."""
        return {
            **os.environ,
            "LD_PRELOAD": str(self.state_dir / "net" / "podnet.so"),
            "PODNET_HOSTS": str(self.state_dir / "net" / "hosts"),
        }

    def container_pid(self, namespace: str, pod: str, container: str) -> int:
        """The PID of a running container (its ``containerID``)."""
        for status in get("pod", pod, namespace)["status"].get("containerStatuses") or []:
            if status["name"] == container and "running" in status["state"]:
                return int(status["containerID"].removeprefix("process://"))
        raise AssertionError(f"{namespace}/{pod}: {container} is not running")

    def node_log(self, lines: int = 80) -> str:
        text = (self.state_dir / "node.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("cluster")
    try:
        bin_dir = controlplane.binaries()
    except controlplane.ControlPlaneError as error:
        pytest.fail(str(error))
    library = podnet_library()
    broker = kafka.KafkaCluster()
    control_plane = controlplane.ControlPlane(directory / "control-plane", bin_dir)
    node_process: subprocess.Popen[bytes] | None = None
    saved = os.environ.get("KUBECONFIG")
    try:
        broker.start(timeout=KAFKA_START_S)
        kafka.warm_up(broker.bootstrap, timeout=KAFKA_START_S)
        control_plane.start()
        os.environ["KUBECONFIG"] = str(control_plane.kubeconfig)
        state = directory / "node"
        (state / "net").mkdir(parents=True)
        shutil.copy(library, state / "net" / "podnet.so")
        certificate, key = control_plane.authority.issue("kubelet", ips=("127.0.0.1",))
        name = f"kgo-e2e-{uuid.uuid4().hex[:6]}"
        config = node.NodeConfig(
            name=name,
            api_url=control_plane.url,
            token=control_plane.token,
            ca_file=str(control_plane.ca_file),
            certificate_file=str(certificate),
            key_file=str(key),
            kubelet_port=controlplane.loopback_port(),
            subnet=_free_subnet(),
            state_dir=str(state),
            podnet=str(state / "net" / "podnet.so"),
            root=str(ROOT),
            venv_bin=str(Path(sys.executable).parent),
        )
        config_path = state / "node.json"
        config_path.write_text(json.dumps(config.__dict__))
        with (state / "node.log").open("ab") as log:
            node_process = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "e2e" / "support" / "node.py"),
                    "--config",
                    str(config_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        running = Cluster(control_plane, state, broker.bootstrap, name, node_process)

        def registered() -> bool:
            if node_process is not None and node_process.poll() is not None:
                pytest.fail(f"the node exited:\n{running.node_log()}")
            return attempt("kubectl", "get", f"node/{name}").returncode == 0

        wait_for(registered, f"node {name} registered")
        done = attempt(
            "kubectl", "wait", f"node/{name}", "--for=condition=Ready", f"--timeout={WAIT_S}s"
        )
        if done.returncode != 0:
            pytest.fail(f"the node never became Ready: {done.stderr}\n{running.node_log()}")
        yield running
    finally:
        if node_process is not None:
            node_process.send_signal(signal.SIGTERM)
            try:
                node_process.wait(90)
            except subprocess.TimeoutExpired:
                node_process.kill()
                node_process.wait(30)
        control_plane.stop()
        broker.close()
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved


@pytest.fixture(scope="session")
def operator(cluster: Cluster) -> Iterator[str]:
    """The chart installed with its defaults into ``kgo-system``: three replicas, watching
    every namespace. Its release name."""
    run("kubectl", "create", "namespace", OPERATOR_NAMESPACE)
    run(
        "helm", "install", RELEASE, str(ROOT / "charts" / "kafka-group-operator"),
        "--namespace", OPERATOR_NAMESPACE,
        "--set", f"kafka.bootstrapServers={cluster.bootstrap}",
        # The session's Kafka is one broker.
        "--set", "stateTopic.replicationFactor=1",
        "--set", "stateTopic.minInsyncReplicas=1",
        "--wait", "--timeout", f"{HELM_WAIT_S}s",
        timeout=HELM_WAIT_S + 60,
    )  # fmt: skip
    yield RELEASE
    run(
        "helm", "uninstall", RELEASE, "--namespace", OPERATOR_NAMESPACE,
        "--wait", "--timeout", f"{HELM_WAIT_S}s",
        timeout=HELM_WAIT_S + 60,
    )  # fmt: skip


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the test's own, deleted after it."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    run("kubectl", "create", "namespace", name)
    wait_for(
        lambda: attempt("kubectl", "get", "serviceaccount", "default", "-n", name).returncode == 0,
        f"the default ServiceAccount of {name}",
    )
    yield name
    run("kubectl", "delete", "namespace", name, "--wait=false")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attach the node's log, and the logs of the test namespace's pods and the operator's,
    to a failing e2e test."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        arguments = getattr(item, "funcargs", {})
        running = arguments.get("cluster")
        if isinstance(running, Cluster):
            report.sections.append(("node log", running.node_log()))
            for namespace in (arguments.get("namespace"), OPERATOR_NAMESPACE):
                if isinstance(namespace, str):
                    report.sections.extend(_pod_logs(namespace))


def _pod_logs(namespace: str, lines: int = 60) -> list[tuple[str, str]]:
    """The last ``lines`` of each container's log in ``namespace`` (sidecars included)."""
    listed = attempt("kubectl", "get", "pods", "-n", namespace, "-o", "json")
    if listed.returncode != 0:
        return [(f"pods of {namespace}", listed.stderr)]
    sections = []
    for pod in json.loads(listed.stdout).get("items", []):
        spec = pod.get("spec") or {}
        name = pod["metadata"]["name"]
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            done = attempt(
                "kubectl", "logs", name, "-n", namespace, "-c", container["name"],
                f"--tail={lines}",
            )  # fmt: skip
            sections.append((f"log of {namespace}/{name}/{container['name']}", done.stdout))
    return sections
