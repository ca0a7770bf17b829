"""Kubernetes Leases (``coordination.k8s.io/v1``): read, create, take, renew and release one.

The only place the operator touches Leases. Every write is conditional: a create fails with
``errors.Conflict`` when the Lease exists, and a replace carries the ``resourceVersion`` that
was read, so of two replicas writing the same version exactly one succeeds and the other gets
``errors.Conflict``. That is what makes a Lease a lock; deciding *when* to write is the
elector's (``kube.elector``) and *which* partitions to hold the plan's
(``coordinator.lease_plan``).

Times in a Lease (``acquireTime``, ``renewTime``) are informative only: other replicas judge
expiry by their own clock, from when they saw the record change, as client-go's
leaderelection does, so clocks need not agree.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import errors

# Go's metav1.MicroTime layout (RFC3339Micro), as Lease times are serialised.
_MICRO_TIME = "%Y-%m-%dT%H:%M:%S.%fZ"


@dataclass(frozen=True, slots=True)
class Lease:
    """The fields of a Lease the elector reads, and the version they were read at."""

    name: str
    holder: str | None
    duration_seconds: int
    transitions: int
    resource_version: str
    acquire_time: str | None = None
    renew_time: str | None = None

    @property
    def free(self) -> bool:
        """Nobody holds it (never taken, or released)."""
        return not self.holder


def lease_name(prefix: str, partition: int) -> str:
    """The Lease that decides who coordinates state-topic ``partition``."""
    return f"{prefix}-{partition}"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime(_MICRO_TIME)


def from_object(raw: dict[str, Any]) -> Lease:
    """The Lease of an API object (as read, or as a watch reports it)."""
    metadata = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    duration = spec.get("leaseDurationSeconds")
    transitions = spec.get("leaseTransitions")
    return Lease(
        name=str(metadata.get("name", "")),
        holder=str(spec["holderIdentity"]) if spec.get("holderIdentity") else None,
        duration_seconds=duration if isinstance(duration, int) and duration > 0 else 0,
        transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
        resource_version=str(metadata.get("resourceVersion", "")),
        acquire_time=spec.get("acquireTime"),
        renew_time=spec.get("renewTime"),
    )


def _body(
    namespace: str,
    name: str,
    spec: dict[str, Any],
    resource_version: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


async def read(api: kube_client.KubeClient, namespace: str, name: str) -> Lease | None:
    """The Lease ``name``, or None when it does not exist yet."""
    raw = await api.get_or_none(kube_client.LEASES, namespace, name)
    return None if raw is None else from_object(raw)


async def create(
    api: kube_client.KubeClient,
    namespace: str,
    name: str,
    holder: str,
    duration_seconds: int,
) -> Lease:
    """Create the Lease held by ``holder``; ``errors.Conflict`` when someone created it first."""
    now = _now()
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_seconds,
        "acquireTime": now,
        "renewTime": now,
        "leaseTransitions": 0,
    }
    raw = await api.create(kube_client.LEASES, namespace, _body(namespace, name, spec))
    return from_object(raw)


async def take(
    api: kube_client.KubeClient,
    namespace: str,
    lease: Lease,
    holder: str,
    duration_seconds: int,
) -> Lease:
    """Make ``holder`` the holder of ``lease`` as read; ``errors.Conflict`` if it changed since.

    A change of holder counts a transition, as client-go does; the same holder taking its
    own Lease back (a restarted replica) does not.
    """
    now = _now()
    same = lease.holder == holder
    spec = {
        "holderIdentity": holder,
        "leaseDurationSeconds": duration_seconds,
        "acquireTime": lease.acquire_time if same and lease.acquire_time else now,
        "renewTime": now,
        "leaseTransitions": lease.transitions if same else lease.transitions + 1,
    }
    return await _replace(api, namespace, lease, spec)


async def renew(api: kube_client.KubeClient, namespace: str, lease: Lease) -> Lease:
    """Extend ``lease`` (held by us) as read; ``errors.Conflict`` if anyone wrote it since."""
    if lease.holder is None:
        raise errors.Conflict(f"lease {lease.name} is free: there is nothing to renew")
    spec = {
        "holderIdentity": lease.holder,
        "leaseDurationSeconds": lease.duration_seconds,
        "acquireTime": lease.acquire_time or _now(),
        "renewTime": _now(),
        "leaseTransitions": lease.transitions,
    }
    return await _replace(api, namespace, lease, spec)


async def release(api: kube_client.KubeClient, namespace: str, lease: Lease) -> Lease:
    """Give ``lease`` up so that another replica may take it at once, without waiting for expiry.

    As client-go's ``release``: the holder is cleared and the duration set to one second.
    """
    spec = {
        "holderIdentity": None,
        "leaseDurationSeconds": 1,
        "acquireTime": lease.acquire_time,
        "renewTime": _now(),
        "leaseTransitions": lease.transitions,
    }
    return await _replace(api, namespace, lease, {k: v for k, v in spec.items() if v is not None})


async def _replace(
    api: kube_client.KubeClient, namespace: str, lease: Lease, spec: dict[str, Any]
) -> Lease:
    raw = await api.replace(
        kube_client.LEASES,
        namespace,
        lease.name,
        _body(namespace, lease.name, spec, resource_version=lease.resource_version),
    )
    return from_object(raw)
