"""Our CRDs as JSON schemas, for validating resources the way the API server would.

jsonschema checks types, enums, bounds, patterns and required fields of the CRD's
``openAPIV3Schema``; ``pruned_paths`` adds what jsonschema cannot: the API server silently
drops (prunes) every field a structural schema does not declare, so a status the operator
writes must not contain any. ``cel_violations`` evaluates the schema's CEL rules
(``x-kubernetes-validations``) with a CEL interpreter, as the API server does on a create
(``old`` absent: transition rules are skipped) or an update.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import celpy
import celpy.adapter
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
EXAMPLES = ROOT / "examples"


def load_crd(plural: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((CRDS / f"{plural}.kafkagroups.io.yaml").read_text())
    return crd


def schema_of(plural: str) -> dict[str, Any]:
    version = load_crd(plural)["spec"]["versions"][0]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def _list_type(
    validator: Any, list_type: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[jsonschema.ValidationError]:
    """The API server's list semantics: a ``set`` has unique items, a ``map`` unique keys."""
    if not isinstance(instance, list):
        return
    if list_type == "set":
        keys = [repr(item) for item in instance]
    elif list_type == "map":
        names = schema.get("x-kubernetes-list-map-keys", [])
        keys = [repr([item.get(name) for name in names]) for item in instance]
    else:
        return
    if len(set(keys)) != len(keys):
        yield jsonschema.ValidationError(f"duplicate entries in a list of type {list_type}")


# Draft 7 validation plus the Kubernetes list types (CRDs may not use uniqueItems).
KubernetesValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-type": _list_type}
)


def validator_for(plural: str) -> Any:
    return KubernetesValidator(
        schema_of(plural), format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )


def validate(plural: str, resource: Mapping[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` like the API server would reject ``resource``."""
    validator_for(plural).validate(resource)


def pruned_paths(schema: Mapping[str, Any], value: Any, path: str = "") -> Iterator[str]:
    """Paths in ``value`` that a structural schema does not declare (the API server drops them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, Mapping):
        properties = schema.get("properties")
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if properties is not None and key in properties:
                yield from pruned_paths(properties[key], item, f"{path}.{key}")
            elif isinstance(additional, Mapping):
                yield from pruned_paths(additional, item, f"{path}.{key}")
            elif properties is not None or additional is None:
                if schema.get("type") == "object" and properties is None and additional is None:
                    continue  # e.g. metadata: the API server's own schema applies
                yield f"{path}.{key}"
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from pruned_paths(schema["items"], item, f"{path}[{index}]")


def cel_violations(
    plural: str, resource: Mapping[str, Any], old: Mapping[str, Any] | None = None
) -> list[str]:
    """The messages of the CEL rules ``resource`` breaks (an update of ``old`` if given)."""
    return list(_cel(celpy.Environment(), schema_of(plural), resource, old))


def _cel(environment: Any, schema: Mapping[str, Any], value: Any, old: Any) -> Iterator[str]:
    for rule in schema.get("x-kubernetes-validations", ()):
        if "oldSelf" in rule["rule"] and old is None:
            continue  # a transition rule applies only to updates of an existing value
        program = environment.program(environment.compile(rule["rule"]))
        activation = {"self": celpy.adapter.json_to_cel(value)}
        if old is not None:
            activation["oldSelf"] = celpy.adapter.json_to_cel(old)
        if not bool(program.evaluate(activation)):
            yield str(rule.get("message", rule["rule"]))
    if isinstance(value, Mapping):
        old_map = old if isinstance(old, Mapping) else {}
        for key, item in value.items():
            child = (schema.get("properties") or {}).get(key)
            if child is None and isinstance(schema.get("additionalProperties"), Mapping):
                child = schema["additionalProperties"]
            if child is not None:
                yield from _cel(environment, child, item, old_map.get(key))
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            yield from _cel(environment, schema["items"], item, None)


def examples(kind: str) -> list[dict[str, Any]]:
    """Every resource of ``kind`` in ``examples/*.yaml``."""
    found = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == kind:
                found.append(document)
    return found
