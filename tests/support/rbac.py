"""What the operator asks of the Kubernetes API, derived from its code: for RBAC checks.

``used()`` is every ``(apiGroup, resource, verb)`` the operator needs: its ``KubeClient``
calls, read from the source, and what kopf does for the handlers it registers. The chart's
rendered roles (tests/chart) and a real cluster's authorizer (e2e) are checked against it.
"""

from __future__ import annotations

import ast

import kopf

from kafka_group_operator import handlers
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.kube import spark as kube_spark
from tests.support.kube_schema import ROOT

# KubeClient's methods and the (subresource, verb) each asks the API server for.
_CLIENT_VERBS = {
    "get": (None, "get"),
    "get_or_none": (None, "get"),
    "list": (None, "list"),
    "list_versioned": (None, "list"),
    "watch": (None, "watch"),
    "create": (None, "create"),
    "patch": (None, "patch"),
    "replace": (None, "update"),
    "patch_status": ("status", "patch"),
    "delete": (None, "delete"),
}
Need = tuple[str, str, str]  # (apiGroup, resource, verb)


def client_calls() -> set[Need]:
    """Every (group, resource, verb) the operator's code asks for through ``KubeClient``.

    Read from the source: each call ``<client>.<method>(<KIND>, ...)`` whose first argument
    is one of the ``Kind`` constants of ``kube.client`` and ``kube.spark``.
    """
    kinds = {
        name: value
        for module in (kube_client, kube_spark)
        for name, value in vars(module).items()
        if isinstance(value, kube_client.Kind)
    }
    needs: set[Need] = set()
    for path in (ROOT / "operator" / "kafka_group_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _CLIENT_VERBS
                and node.args
            ):
                continue
            first = node.args[0]
            name = first.attr if isinstance(first, ast.Attribute) else getattr(first, "id", None)
            if name not in kinds:
                continue
            kind = kinds[name]
            sub, verb = _CLIENT_VERBS[node.func.attr]
            needs.add((kind.group, f"{kind.plural}/{sub}" if sub else kind.plural, verb))
    return needs


def kopf_needs() -> set[Need]:
    """What kopf does for the handlers the operator registers.

    It lists and watches every handled resource; for those with change handlers, daemons or
    timers it patches the object (finalizer, progress annotations) and its status
    (``patch.status``); and it posts Events. Those resources own children whose
    ownerReferences set blockOwnerDeletion (``kopf.adopt``, scheduled snapshots, Spark
    applications), which OwnerReferencesPermissionEnforcement grants only with update on
    the owner's finalizers.
    """
    handlers.load()
    registry = kopf.get_default_registry()
    needs: set[Need] = {("", "events", "create")}
    for selector in registry._watching.get_all_selectors():
        needs |= {
            (selector.group or "", str(selector.any_name), verb) for verb in ("list", "watch")
        }
    for selector in registry._changing.get_all_selectors() | registry._spawning.get_all_selectors():
        group, plural = selector.group or "", str(selector.any_name)
        needs |= {(group, plural, verb) for verb in ("list", "watch", "patch")}
        needs |= {(group, f"{plural}/status", "patch"), (group, f"{plural}/finalizers", "update")}
    return needs


def used() -> set[Need]:
    return client_calls() | kopf_needs()
