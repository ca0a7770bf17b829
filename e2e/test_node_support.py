"""The test node's own pieces, without a cluster: how a container's environment and command
line are resolved (``support/pods.py``), the name table Services become, and the pod network
shim (``support/podnet.c``) in a real process."""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.conftest import podnet_library
from e2e.support import pods

POD = {
    "metadata": {
        "name": "orders-1",
        "namespace": "shop",
        "uid": "u-1",
        "labels": {"app": "orders"},
    },
    "spec": {"nodeName": "node-a", "serviceAccountName": "reader"},
}
FACTS = pods.PodFacts(POD, pod_ip="127.9.0.7", host_ip="127.0.0.1")
OBJECTS = {
    ("Secret", "shop", "token"): {"data": {"token": base64.b64encode(b"s3cret").decode()}},
    ("ConfigMap", "shop", "settings"): {"data": {"level": "debug", "mode": "fast"}},
}


def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    return OBJECTS.get((kind, namespace, name))


def test_the_environment_is_resolved_as_the_kubelet_does() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "token", "key": "token"}}},
            {
                "name": "LEVEL",
                "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "level"}},
            },
            {
                "name": "ABSENT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}},
            },
            {"name": "URL", "value": "http://$(IP):8080/$(NAME)/$(UNDEFINED)/$$(NAME)"},
            {
                "name": "MEMORY",
                "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
            },
        ],
        "resources": {"limits": {"memory": "256Mi"}},
    }
    env = pods.container_env(container, FACTS, lookup)
    assert env == {
        "CFG_level": "debug",
        "CFG_mode": "fast",
        "NAME": "orders-1",
        "NS": "shop",
        "IP": "127.9.0.7",
        "APP": "orders",
        "TOKEN": "s3cret",
        "LEVEL": "debug",
        "URL": "http://127.9.0.7:8080/orders-1/$(UNDEFINED)/$(NAME)",
        "MEMORY": "256",
    }


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"secretKeyRef": {"name": "nope", "key": "x"}}, 'secret "nope" not found'),
        ({"secretKeyRef": {"name": "token", "key": "x"}}, "couldn't find key x"),
        ({"configMapKeyRef": {"name": "nope", "key": "x"}}, 'configmap "nope" not found'),
        ({"fieldRef": {"fieldPath": "spec.nothing"}}, "unsupported fieldRef"),
    ],
)
def test_what_the_kubelet_cannot_resolve_is_a_config_error(
    source: dict[str, Any], message: str
) -> None:
    with pytest.raises(pods.ConfigError, match=message):
        pods.container_env({"env": [{"name": "X", "valueFrom": source}]}, FACTS, lookup)


def test_the_command_line_maps_the_image_to_the_source_tree(tmp_path: Path) -> None:
    (tmp_path / "kgo").write_text("")
    (tmp_path / "kgo").chmod(0o755)
    root = Path("/src")
    command = {"command": ["kgo", "gateway"], "args": ["--config", "/opt/kafka-group-operator/x"]}
    assert pods.argv(command, {}, root, str(tmp_path)) == [
        str(tmp_path / "kgo"), "gateway", "--config", "/src/x",
    ]  # fmt: skip
    # No command and no args: the image's CMD; args alone follow its (empty) ENTRYPOINT.
    assert pods.argv({}, {}, root, str(tmp_path)) == [str(tmp_path / "kgo"), "operator"]
    assert pods.argv({"args": ["kgo", "$(MODE)"]}, {"MODE": "gateway"}, root, str(tmp_path))[
        1:
    ] == ["gateway"]
    with pytest.raises(pods.ConfigError, match="not found in"):
        pods.argv({"command": ["no-such-program"]}, {}, root, str(tmp_path))


def _pod(name: str, ip: str, ready: bool, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop", "labels": labels},
        "spec": {
            "containers": [{"name": "c", "ports": [{"name": "api", "containerPort": 8080}]}],
            **spec,
        },
        "status": {
            "podIP": ip,
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"selector": {"app": "api"}, **spec},
    }


def test_services_resolve_to_their_endpoints() -> None:
    table = pods.name_table(
        [
            _service("api", clusterIP="10.96.0.9", ports=[{"port": 80, "targetPort": "api"}]),
            _service("api-headless", clusterIP="None", publishNotReadyAddresses=True),
            _service(
                "empty", clusterIP="10.96.0.8", selector={"app": "none"}, ports=[{"port": 80}]
            ),
        ],
        [
            _pod(
                "api-0",
                "127.9.0.2",
                True,
                {"app": "api"},
                hostname="api-0",
                subdomain="api-headless",
            ),
            _pod(
                "api-1",
                "127.9.0.3",
                False,
                {"app": "api"},
                hostname="api-1",
                subdomain="api-headless",
            ),
            _pod("other", "127.9.0.4", True, {"app": "other"}),
        ],
        api_server=("127.0.0.1", 20000),
        refusing_ip="127.9.255.254",
    )
    assert table.splitlines() == [
        "kubernetes.default.svc 443 127.0.0.1:20000",
        "kubernetes.default.svc * 127.9.255.254",
        # Ready endpoints only, at the named target port.
        "api.shop.svc 80 127.9.0.2:8080",
        "api.shop.svc * 127.9.255.254",
        # Not-ready addresses published, and each pod's own name.
        "api-headless.shop.svc * 127.9.0.2 127.9.0.3",
        "api-0.api-headless.shop.svc * 127.9.0.2",
        "api-1.api-headless.shop.svc * 127.9.0.3",
        # No endpoint: connections are refused, as kube-proxy rejects them.
        "empty.shop.svc 80 127.9.255.254",
        "empty.shop.svc * 127.9.255.254",
    ]


# In a process with podnet.so preloaded: what it resolves, binds and connects to.
_PROBE = """
import json, socket, sys
out = {}
def resolve(name, port):
    return sorted({a[4] for a in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)})
out["service"] = resolve("api.shop.svc", 80)
out["search"] = resolve("api", 80)
out["cluster_local"] = resolve("api-0.api-headless.shop.svc.cluster.local", 9092)
out["own_name"] = resolve("api-0", 1)
server = socket.socket(); server.bind(("0.0.0.0", 0)); server.listen()
out["bound"] = server.getsockname()
client = socket.socket(); client.connect(("127.0.0.1", server.getsockname()[1]))
out["localhost_peer"] = client.getpeername()
machine = socket.socket(); machine.connect(("127.0.0.1", int(sys.argv[1])))
out["machine_peer"] = machine.getpeername()
# IPv6 sockets carrying IPv4, as the JVM's are.
mapped = socket.socket(socket.AF_INET6); mapped.connect(("::ffff:127.0.0.1", out["bound"][1]))
out["mapped_localhost_peer"] = mapped.getpeername()[:2]
server6 = socket.socket(socket.AF_INET6); server6.bind(("::", 0)); server6.listen()
out["bound6"] = server6.getsockname()[:2]
client6 = socket.socket(socket.AF_INET6); client6.connect(("::ffff:127.0.0.1", out["bound6"][1]))
out["mapped_localhost_peer6"] = client6.getpeername()[:2]
client4 = socket.socket(); client4.connect(("127.0.0.1", out["bound6"][1]))
out["localhost_peer6"] = client4.getpeername()
machine6 = socket.socket(socket.AF_INET6); machine6.connect(("::ffff:127.0.0.1", int(sys.argv[1])))
out["mapped_machine_peer"] = machine6.getpeername()[:2]
try:
    socket.getaddrinfo("absent.shop.svc", 1)
except socket.gaierror:
    out["absent"] = "unresolved"
print(json.dumps(out))
"""


def test_the_pod_network_shim(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(
        "api.shop.svc 80 127.9.0.2:8080 127.9.0.3:8080\n"
        "api.shop.svc * 127.9.255.254\n"
        "api-0.api-headless.shop.svc * 127.9.0.2\n"
    )
    with socket.socket() as machine:  # something on the machine's 127.0.0.1
        machine.bind(("127.0.0.1", 0))
        machine.listen()
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(machine.getsockname()[1])],
            env={
                "LD_PRELOAD": str(podnet_library()),
                "PODNET_IP": "127.9.0.2",
                "PODNET_HOSTS": str(hosts),
                "PODNET_NAMESPACE": "shop",
                "PODNET_HOSTNAME": "api-0",
            },
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    out = json.loads(done.stdout)
    assert out["service"] == out["search"] == [["127.9.0.2", 8080], ["127.9.0.3", 8080]]
    assert out["cluster_local"] == [["127.9.0.2", 9092]]
    assert out["own_name"] == [["127.9.0.2", 1]]
    # The wildcard is the pod's address; its 127.0.0.1 is the pod's where the pod listens,
    # the machine's elsewhere.
    assert out["bound"][0] == "127.9.0.2"
    assert out["localhost_peer"] == out["bound"]
    assert out["machine_peer"][0] == "127.0.0.1"
    # The same through IPv6 sockets in IPv4-mapped form (a JVM connecting to a Python server
    # on 127.0.0.1, as Spark does to its Python workers; a JVM listening on "::").
    assert out["mapped_localhost_peer"] == ["::ffff:127.9.0.2", out["bound"][1]]
    assert out["bound6"][0] == "::ffff:127.9.0.2"
    assert out["mapped_localhost_peer6"] == out["bound6"]
    assert out["localhost_peer6"] == ["127.9.0.2", out["bound6"][1]]
    assert out["mapped_machine_peer"][0] == "::ffff:127.0.0.1"
    assert out["absent"] == "unresolved"
