"""Kubernetes calls for the Spark jobs: SparkApplications of the Kubeflow spark-operator.

Thin wrappers over ``client.KubeClient``; whether the spark-operator is installed is the
existence of its CRD's API resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka_group_operator.kube import client, errors

SPARK_APPLICATIONS = client.Kind("sparkoperator.k8s.io", "v1beta2", "sparkapplications")


async def spark_operator_installed(kube: client.KubeClient) -> bool:
    return await kube.kind_exists(SPARK_APPLICATIONS)


async def create_application(kube: client.KubeClient, body: Mapping[str, Any]) -> client.JSON:
    """Creates the application; an existing one of the same name (a repeated call) is returned."""
    meta = body["metadata"]
    try:
        return await kube.create(SPARK_APPLICATIONS, meta["namespace"], body)
    except errors.Conflict:
        return await kube.get(SPARK_APPLICATIONS, meta["namespace"], meta["name"])


async def get_application(kube: client.KubeClient, namespace: str, name: str) -> client.JSON | None:
    return await kube.get_or_none(SPARK_APPLICATIONS, namespace, name)
