"""kopf handler registrations: thin glue between resources, manifests, kube and the runtime.

kopf registers a handler when its module is imported; ``load()`` imports every handler module
so that ``kgo operator`` and the tests run the same set.
"""

from __future__ import annotations

import importlib

MODULES = (
    "kafka_group_operator.handlers.logs",
    "kafka_group_operator.handlers.lifecycle",
    "kafka_group_operator.handlers.consumer_groups",
    "kafka_group_operator.handlers.snapshots",
)


def load() -> None:
    """Import (and so register with kopf's default registry) every handler module."""
    for module in MODULES:
        importlib.import_module(module)
