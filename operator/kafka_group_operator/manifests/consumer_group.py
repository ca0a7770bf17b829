"""The children of a ConsumerGroup: its StatefulSet, headless Service and token Secret.

Pure builders (``build_*``): a ``ConsumerGroupSpec`` in, a manifest dict out, exactly the body
the operator creates. Owner references are added by the handlers (``kopf.adopt``); the names
and labels here are the contract with everything that finds these objects again (pod events,
the scale subresource's ``labelSelector``, ``kubectl``).

With ``spec.clientProtocol: kafka`` the pods get the gateway (``kgo gateway``) as a native
sidecar (an init container with ``restartPolicy: Always``: it starts before the application
and stops after it); the application containers get only ``KAFKA_BOOTSTRAP_SERVERS`` (the
gateway on loopback), ``KAFKA_GROUP_ID`` and ``KAFKA_GROUP_INSTANCE_ID``: the group's token
and the Kafka Secret stay in the gateway.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka_group_operator.specs import consumer_group

# The one label that selects a group's pods; also the scale subresource's selector.
GROUP_LABEL = "kafkagroups.io/consumer-group"
GROUP_ID_ANNOTATION = "kafkagroups.io/group-id"
TOKEN_KEY = "token"
KAFKA_CONFIG_DIR = "/etc/kafka-group/kafka"
KAFKA_CONFIG_VOLUME = "kgo-kafka-config"
# Environment names the operator owns; a template's own values for them are replaced.
INJECTED_ENV = (
    "KGO_GROUP_ID",
    "KGO_COORDINATOR_URL",
    "KGO_GROUP_TOKEN",
    "KGO_INSTANCE_ID",
    "KGO_MEMBER_ID",
    "KGO_TOPICS",
    "KAFKA_BOOTSTRAP_SERVERS",
    "KGO_AUTO_OFFSET_RESET",
    "KGO_SESSION_TIMEOUT_MS",
    "KGO_KAFKA_CONFIG_DIR",
)
GATEWAY_CONTAINER = "kgo-gateway"
# What an application container of a ``kafka`` group is given (any Kafka client reads these
# three and nothing of ours); a template's own values for them are replaced.
KAFKA_CLIENT_ENV = ("KAFKA_BOOTSTRAP_SERVERS", "KAFKA_GROUP_ID", "KAFKA_GROUP_INSTANCE_ID")


# The gateway's requests and limits unless the operator is given others: an idle gateway
# takes about 50 MB; forwarding takes CPU in proportion to the client's traffic, so no CPU
# limit throttles it (the request reserves a little for a steady flow).
GATEWAY_RESOURCES: Mapping[str, Any] = {
    "requests": {"cpu": "50m", "memory": "64Mi"},
    "limits": {"memory": "256Mi"},
}
# The startup probe's check: a TCP connection to the gateway's port. The gateway listens on
# loopback only, which the kubelet's own tcpSocket probe (to the pod's IP) cannot reach; a
# command runs in the pod's network namespace. Python, not ``kgo``: the interpreter alone
# starts in tens of milliseconds.
GATEWAY_PROBE = (
    "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2).close()"
)


@dataclass(frozen=True)
class GatewaySettings:
    """What the gateway sidecar needs from the operator's own settings."""

    # The operator's image (it contains ``kgo``).
    image: str
    # The coordinator listener as the pods reach it, host:port.
    coordinator_address: str
    # The loopback port the application bootstraps at.
    port: int = 9092
    image_pull_policy: str = "IfNotPresent"
    # The sidecar's resources (a Kubernetes ResourceRequirements object).
    resources: Mapping[str, Any] = field(default_factory=lambda: dict(GATEWAY_RESOURCES))


def stateful_set_name(group: consumer_group.ConsumerGroupSpec) -> str:
    return group.name


def service_name(group: consumer_group.ConsumerGroupSpec) -> str:
    return group.name


def token_secret_name(name: str) -> str:
    return f"{name}-group-token"


def instance_id(name: str, ordinal: int) -> str:
    """The static member id of the pod with ``ordinal``: its StatefulSet pod name."""
    return f"{name}-{ordinal}"


def ordinal_of(name: str, pod_name: str) -> int | None:
    """The ordinal of a pod of the group ``name``, or ``None`` when it is not one of them."""
    prefix = f"{name}-"
    if not pod_name.startswith(prefix) or not pod_name[len(prefix) :].isdigit():
        return None
    return int(pod_name[len(prefix) :])


def selector_labels(name: str) -> dict[str, str]:
    return {GROUP_LABEL: name}


def label_selector(name: str) -> str:
    """The serialized selector of ``status.labelSelector`` (for HPA and KEDA)."""
    return ",".join(f"{key}={value}" for key, value in selector_labels(name).items())


def common_labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "kafka-group-consumer",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "kafka-group-operator",
        **selector_labels(name),
    }


def build_stateful_set(
    group: consumer_group.ConsumerGroupSpec,
    coordinator_url: str,
    gateway: GatewaySettings | None = None,
) -> dict[str, Any]:
    """The consumers' StatefulSet: pod names are the members' static instance ids.

    ``gateway`` is required when ``group.client_protocol`` is ``kafka``."""
    template = copy.deepcopy(dict(group.template))
    template_metadata = dict(template.get("metadata") or {})
    pod_spec = dict(template["spec"])
    labels = {**dict(template_metadata.get("labels") or {}), **common_labels(group.name)}
    annotations = {
        **dict(template_metadata.get("annotations") or {}),
        GROUP_ID_ANNOTATION: group.group_id,
    }
    if group.client_protocol == "kafka":
        if gateway is None:
            raise ValueError("clientProtocol kafka needs the gateway's settings")
        pod_spec["containers"] = [
            _with_env(container, _kafka_client_env(group, gateway), KAFKA_CLIENT_ENV)
            for container in pod_spec["containers"]
        ]
        own_init = [
            container
            for container in pod_spec.get("initContainers") or []
            if container.get("name") != GATEWAY_CONTAINER
        ]
        # First: the application's own init containers may already need Kafka.
        pod_spec["initContainers"] = [build_gateway_container(group, gateway), *own_init]
    else:
        env = _injected_env(group, coordinator_url)
        pod_spec["containers"] = [
            _with_group_env(container, env, group) for container in pod_spec["containers"]
        ]
    if group.kafka.secret_name is not None:
        volumes = [
            volume
            for volume in pod_spec.get("volumes") or []
            if volume.get("name") != KAFKA_CONFIG_VOLUME
        ]
        volumes.append(
            {"name": KAFKA_CONFIG_VOLUME, "secret": {"secretName": group.kafka.secret_name}}
        )
        pod_spec["volumes"] = volumes
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": stateful_set_name(group),
            "namespace": group.namespace,
            "labels": common_labels(group.name),
        },
        "spec": {
            "replicas": group.replicas,
            "serviceName": service_name(group),
            # Members are independent: no need to start or stop them one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector_labels(group.name)},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def build_stateful_set_patch(
    group: consumer_group.ConsumerGroupSpec,
    coordinator_url: str,
    gateway: GatewaySettings | None = None,
) -> dict[str, Any]:
    """A merge patch bringing an existing StatefulSet to ``group``'s spec.

    Only the mutable fields: a StatefulSet's selector and service name cannot change.
    """
    desired = build_stateful_set(group, coordinator_url, gateway)
    return {
        "metadata": {"labels": desired["metadata"]["labels"]},
        "spec": {"replicas": desired["spec"]["replicas"], "template": desired["spec"]["template"]},
    }


def build_headless_service(group: consumer_group.ConsumerGroupSpec) -> dict[str, Any]:
    """The headless Service that gives each consumer pod a stable DNS name."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(group),
            "namespace": group.namespace,
            "labels": common_labels(group.name),
        },
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(group.name),
            # Pods must be resolvable while they start, before they are ready.
            "publishNotReadyAddresses": True,
        },
    }


def build_token_secret(group: consumer_group.ConsumerGroupSpec, token: str) -> dict[str, Any]:
    """The group's bearer-token Secret (the token is generated by the caller, once)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": token_secret_name(group.name),
            "namespace": group.namespace,
            "labels": common_labels(group.name),
        },
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_from_secret(secret: Mapping[str, Any]) -> str | None:
    """The token stored in a Secret built by ``build_token_secret``."""
    encoded = (secret.get("data") or {}).get(TOKEN_KEY)
    if not isinstance(encoded, str) or not encoded:
        return None
    return base64.b64decode(encoded).decode()


def _injected_env(
    group: consumer_group.ConsumerGroupSpec, coordinator_url: str
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "KGO_GROUP_ID", "value": group.group_id},
        {"name": "KGO_COORDINATOR_URL", "value": coordinator_url},
        {
            "name": "KGO_GROUP_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": token_secret_name(group.name), "key": TOKEN_KEY}
            },
        },
        {"name": "KGO_INSTANCE_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        # A container restarted inside its pod rejoins as the same member (same UID).
        {"name": "KGO_MEMBER_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "KGO_TOPICS", "value": ",".join(group.topics)},
        {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": group.kafka.bootstrap_servers},
        {"name": "KGO_AUTO_OFFSET_RESET", "value": group.auto_offset_reset},
        # A member that loses the coordinator gives its partitions up before the session
        # expires and they move to another member: no double processing.
        {"name": "KGO_SESSION_TIMEOUT_MS", "value": str(group.session_timeout_seconds * 1000)},
    ]
    if group.kafka.secret_name is not None:
        env.append({"name": "KGO_KAFKA_CONFIG_DIR", "value": KAFKA_CONFIG_DIR})
    return env


def build_gateway_container(
    group: consumer_group.ConsumerGroupSpec, gateway: GatewaySettings
) -> dict[str, Any]:
    """The gateway as a native sidecar. It listens on loopback only: the group's token must
    not be usable by anyone outside the pod."""
    env: list[dict[str, Any]] = [
        {"name": "KGO_UPSTREAM_BOOTSTRAP_SERVERS", "value": group.kafka.bootstrap_servers},
        {"name": "KGO_COORDINATOR_KAFKA_ADDRESS", "value": gateway.coordinator_address},
        {"name": "KGO_GROUP_ID", "value": group.group_id},
        {
            "name": "KGO_GROUP_TOKEN",
            "valueFrom": {
                "secretKeyRef": {"name": token_secret_name(group.name), "key": TOKEN_KEY}
            },
        },
        {"name": "KGO_GATEWAY_PORT", "value": str(gateway.port)},
    ]
    container: dict[str, Any] = {
        "name": GATEWAY_CONTAINER,
        "image": gateway.image,
        "imagePullPolicy": gateway.image_pull_policy,
        "args": ["kgo", "gateway"],
        # An init container that keeps running: Kubernetes' native sidecar (1.29+).
        "restartPolicy": "Always",
        "env": env,
        # A native sidecar's startup probe holds the application containers back until it
        # passes: the client's first connection to the gateway finds it listening.
        "startupProbe": {
            "exec": {"command": ["python3", "-c", GATEWAY_PROBE, str(gateway.port)]},
            "periodSeconds": 1,
            "timeoutSeconds": 5,
            "failureThreshold": 60,
        },
        "resources": copy.deepcopy(dict(gateway.resources)),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if group.kafka.secret_name is not None:
        env.append({"name": "KGO_KAFKA_CONFIG_DIR", "value": KAFKA_CONFIG_DIR})
        container["volumeMounts"] = [
            {"name": KAFKA_CONFIG_VOLUME, "mountPath": KAFKA_CONFIG_DIR, "readOnly": True}
        ]
    return container


def _kafka_client_env(
    group: consumer_group.ConsumerGroupSpec, gateway: GatewaySettings
) -> list[dict[str, Any]]:
    return [
        {"name": "KAFKA_BOOTSTRAP_SERVERS", "value": f"127.0.0.1:{gateway.port}"},
        {"name": "KAFKA_GROUP_ID", "value": group.group_id},
        # The pod name: a restarted pod rejoins as the same static member.
        {
            "name": "KAFKA_GROUP_INSTANCE_ID",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
        },
    ]


def _with_env(
    container: Mapping[str, Any], env: list[dict[str, Any]], owned: tuple[str, ...]
) -> dict[str, Any]:
    result = dict(container)
    result["env"] = [*env, *(e for e in container.get("env") or [] if e.get("name") not in owned)]
    return result


def _with_group_env(
    container: Mapping[str, Any],
    env: list[dict[str, Any]],
    group: consumer_group.ConsumerGroupSpec,
) -> dict[str, Any]:
    result = dict(container)
    own = [item for item in container.get("env") or [] if item.get("name") not in INJECTED_ENV]
    result["env"] = [*env, *own]
    if group.kafka.secret_name is not None:
        mounts = [
            mount
            for mount in container.get("volumeMounts") or []
            if mount.get("name") != KAFKA_CONFIG_VOLUME
        ]
        mounts.append(
            {"name": KAFKA_CONFIG_VOLUME, "mountPath": KAFKA_CONFIG_DIR, "readOnly": True}
        )
        result["volumeMounts"] = mounts
    return result
