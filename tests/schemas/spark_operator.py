"""The spark-operator's published SparkApplication schema (``v1beta2``), for validating bodies.

The schema comes from ``kubeflow-spark-api`` on PyPI: the Kubeflow spark-operator's own API
models, generated from the operator's OpenAPI definitions. Their JSON schema is turned into the
shape of a CRD's ``openAPIV3Schema``: references inlined, and optional fields no longer
nullable (the API server rejects a null where the CRD declares a type).
"""

from __future__ import annotations

import functools
from typing import Any


def _inline(node: Any, definitions: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    if isinstance(node, list):
        return [_inline(item, definitions, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:  # a recursive type: accept anything below this depth
            return {}
        return _inline(definitions[name], definitions, (*seen, name))
    any_of = node.get("anyOf")
    if isinstance(any_of, list):
        typed = [option for option in any_of if option != {"type": "null"}]
        if len(typed) == 1:
            rest = {key: value for key, value in node.items() if key not in ("anyOf", "default")}
            return _inline({**typed[0], **rest}, definitions, seen)
    return {
        key: _inline(value, definitions, seen)
        for key, value in node.items()
        if key not in ("$defs", "title", "default")
    }


@functools.cache
def spark_application_schema() -> dict[str, Any]:
    """The ``SparkApplication`` v1beta2 schema, in the shape of a CRD's ``openAPIV3Schema``."""
    from kubeflow_spark_api.models import SparkV1beta2SparkApplication

    generated = SparkV1beta2SparkApplication.model_json_schema()
    schema: dict[str, Any] = _inline(generated, generated.get("$defs", {}))
    return schema
