"""What the node makes of a pod: its containers' environment and command line, the cluster's
name table (Services and pod records, for ``podnet.c``) and the pod's status. Pure functions of
manifests; ``node.py`` does the I/O.

Images are not pulled: every image is the operator's (the Dockerfile's ``operator`` target)
run from this source tree and its virtualenv. So ``kgo``, ``python`` and anything else on the
image's PATH come from the virtualenv's ``bin`` first (then the machine's PATH); paths under
the image's working directory, ``/opt/kafka-group-operator``, are the source tree's; the
image's ENV is set, and a container without ``command`` and ``args`` runs the image's CMD,
``kgo operator``. The tag and ``imagePullPolicy`` mean nothing.
"""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IMAGE_WORKDIR = "/opt/kafka-group-operator"
IMAGE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
IMAGE_ENTRYPOINT: tuple[str, ...] = ()
IMAGE_CMD = ("kgo", "operator")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Looks a ConfigMap or a Secret up: (kind, namespace, name) -> the object, or None.
Lookup = Callable[[str, str, str], Mapping[str, Any] | None]


class ConfigError(Exception):
    """The container cannot be configured (kubelet's CreateContainerConfigError): a missing
    Secret, ConfigMap or key, or a field reference we do not know."""


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, others kept as written,
    ``$$`` is a ``$``."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


@dataclass(frozen=True)
class PodFacts:
    """What field references read besides the manifest."""

    pod: Mapping[str, Any]
    pod_ip: str
    host_ip: str


def field_value(facts: PodFacts, path: str) -> str:
    """A ``fieldRef``'s value (the paths the downward API supports)."""
    metadata = facts.pod.get("metadata") or {}
    spec = facts.pod.get("spec") or {}
    simple = {
        "metadata.name": metadata.get("name"),
        "metadata.namespace": metadata.get("namespace"),
        "metadata.uid": metadata.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    keyed = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if keyed:
        return str((metadata.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    if path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(values.items()))
    raise ConfigError(f"unsupported fieldRef {path!r}")


def _quantity(value: str) -> float:
    units = {
        "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
        "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
    }  # fmt: skip
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value))
    if not match or (match.group(2) and match.group(2) not in units):
        raise ConfigError(f"unsupported quantity {value!r}")
    return float(match.group(1)) * units.get(match.group(2), 1)


def resource_value(container: Mapping[str, Any], reference: Mapping[str, Any]) -> str:
    """A ``resourceFieldRef``'s value; an unset limit is the node's allocatable."""
    resource = str(reference.get("resource", ""))
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None:
        value = {"cpu": "64", "memory": "256Gi", "ephemeral-storage": "100Gi"}.get(name)
    if value is None:
        raise ConfigError(f"unsupported resourceFieldRef {resource!r}")
    divisor = _quantity(str(reference.get("divisor") or "1"))
    amount = _quantity(str(value)) / divisor
    # Kubernetes rounds up to the divisor.
    whole = int(amount) if amount == int(amount) else int(amount) + 1
    return str(whole)


def _data(obj: Mapping[str, Any], secret: bool) -> dict[str, str]:
    if secret:
        return {
            key: base64.b64decode(value).decode(errors="replace")
            for key, value in (obj.get("data") or {}).items()
        }
    values = dict(obj.get("data") or {})
    values.update(
        {
            k: base64.b64decode(v).decode(errors="replace")
            for k, v in (obj.get("binaryData") or {}).items()
        }
    )
    return values


def _key_ref(kind: str, reference: Mapping[str, Any], namespace: str, lookup: Lookup) -> str | None:
    name = str(reference.get("name", ""))
    key = str(reference.get("key", ""))
    optional = bool(reference.get("optional"))
    obj = lookup(kind, namespace, name)
    label = "secret" if kind == "Secret" else "configmap"
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{label} "{name}" not found')
    values = _data(obj, kind == "Secret")
    if key not in values:
        if optional:
            return None
        raise ConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return values[key]


def container_env(container: Mapping[str, Any], facts: PodFacts, lookup: Lookup) -> dict[str, str]:
    """The container's own environment, as the kubelet resolves it: ``envFrom`` first, then
    ``env`` in order, each value expanded against what came before."""
    namespace = str((facts.pod.get("metadata") or {}).get("namespace", "default"))
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            reference = source.get(key)
            if reference is None:
                continue
            obj = lookup(kind, namespace, str(reference.get("name", "")))
            if obj is None:
                if reference.get("optional"):
                    continue
                label = "secret" if kind == "Secret" else "configmap"
                raise ConfigError(f'{label} "{reference.get("name")}" not found')
            for name, value in _data(obj, kind == "Secret").items():
                env[prefix + name] = value
    for item in container.get("env") or []:
        name = str(item["name"])
        if "valueFrom" not in item:
            env[name] = expand(str(item.get("value") or ""), env)
            continue
        source = item["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(facts, str(source["fieldRef"].get("fieldPath", "")))
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"])
        elif "secretKeyRef" in source:
            value = _key_ref("Secret", source["secretKeyRef"], namespace, lookup)
        elif "configMapKeyRef" in source:
            value = _key_ref("ConfigMap", source["configMapKeyRef"], namespace, lookup)
        else:
            raise ConfigError(f"unsupported valueFrom for {name}: {sorted(source)}")
        if value is not None:
            env[name] = value
    return env


def image_path(path: str, root: Path) -> str:
    """A path inside the image: the source tree's for the image's working directory."""
    if path == IMAGE_WORKDIR or path.startswith(IMAGE_WORKDIR + "/"):
        return str(root) + path[len(IMAGE_WORKDIR) :]
    return path


def argv(container: Mapping[str, Any], env: Mapping[str, str], root: Path, path: str) -> list[str]:
    """The command line: Kubernetes' rules for ``command``/``args`` over the image's
    ENTRYPOINT/CMD, ``$(VAR)`` expanded, image paths mapped, the program found on ``path``."""
    command = container.get("command")
    arguments = container.get("args")
    if command is not None:
        words = [*command, *(arguments or [])]
    elif arguments is not None:
        words = [*IMAGE_ENTRYPOINT, *arguments]
    else:
        words = [*IMAGE_ENTRYPOINT, *IMAGE_CMD]
    if not words:
        raise ConfigError("no command specified")
    words = [image_path(expand(str(word), env), root) for word in words]
    program = words[0]
    if "/" not in program:
        found = shutil.which(program, path=path)
        if found is None:
            raise ConfigError(f'executable file not found in $PATH: "{program}"')
        words[0] = found
    return words


# ----------------------------------------------------------------------------- name table


@dataclass(frozen=True)
class Endpoint:
    """A pod behind a Service: its address, readiness and ports by name."""

    ip: str
    ready: bool
    terminating: bool
    hostname: str | None
    subdomain: str | None
    ports: Mapping[str, int] = field(default_factory=dict)


def endpoint_of(pod: Mapping[str, Any]) -> Endpoint | None:
    status = pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or status.get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    ports = {
        str(port["name"]): int(port["containerPort"])
        for container in spec.get("containers") or []
        for port in container.get("ports") or []
        if port.get("name")
    }
    return Endpoint(
        ip=str(ip),
        ready=ready,
        terminating=bool((pod.get("metadata") or {}).get("deletionTimestamp")),
        hostname=spec.get("hostname"),
        subdomain=spec.get("subdomain"),
        ports=ports,
    )


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def name_table(
    services: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    api_server: tuple[str, int],
    refusing_ip: str,
) -> str:
    """The lines ``podnet.c`` answers names from (see there for the format).

    A ClusterIP Service resolves, per port, to its ready endpoints' target ports; with none,
    to ``refusing_ip`` (kube-proxy rejects such connections). A headless Service resolves to
    its endpoints' addresses, and ``<hostname>.<service>`` to a pod's. Terminating pods are
    no endpoints, unless the Service publishes not-ready addresses. The ``kubernetes``
    Service is the API server."""
    lines = [f"kubernetes.default.svc 443 {api_server[0]}:{api_server[1]}"]
    lines.append(f"kubernetes.default.svc * {refusing_ip}")
    by_namespace: dict[str, list[tuple[Mapping[str, Any], Endpoint]]] = {}
    for pod in pods:
        endpoint = endpoint_of(pod)
        if endpoint is not None:
            namespace = str(pod["metadata"]["namespace"])
            by_namespace.setdefault(namespace, []).append((pod, endpoint))
    for service in sorted(
        services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])
    ):
        metadata, spec = service["metadata"], service.get("spec") or {}
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        if namespace == "default" and name == "kubernetes":
            continue
        selector = spec.get("selector")
        if not selector or spec.get("type") == "ExternalName":
            continue
        publish_all = bool(spec.get("publishNotReadyAddresses"))
        members = [
            endpoint
            for pod, endpoint in by_namespace.get(namespace, [])
            if _selects(selector, (pod["metadata"].get("labels") or {}))
            and (publish_all or (endpoint.ready and not endpoint.terminating))
        ]
        members.sort(key=lambda e: e.ip)
        fqdn = f"{name}.{namespace}.svc"
        if spec.get("clusterIP") == "None":
            if members:
                lines.append(f"{fqdn} * " + " ".join(e.ip for e in members))
            for endpoint in members:
                if endpoint.hostname and endpoint.subdomain == name:
                    lines.append(f"{endpoint.hostname}.{fqdn} * {endpoint.ip}")
            continue
        for port in spec.get("ports") or []:
            target = port.get("targetPort", port["port"])
            addresses = []
            for endpoint in members:
                number = target if isinstance(target, int) else endpoint.ports.get(str(target))
                if number is not None:
                    addresses.append(f"{endpoint.ip}:{number}")
            lines.append(f"{fqdn} {port['port']} " + (" ".join(addresses) or refusing_ip))
        lines.append(f"{fqdn} * {refusing_ip}")
    return "\n".join(lines) + "\n"
