"""The spark-operator's published SparkApplication schema (``v1beta2``), for validating bodies."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

CRD_PATH = Path(__file__).parent / "sparkoperator.k8s.io_sparkapplications.yaml"


@functools.cache
def spark_application_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``SparkApplication`` v1beta2 (see README.md for its source)."""
    if not CRD_PATH.exists():
        pytest.fail(f"{CRD_PATH.name} is missing: copy it as tests/schemas/README.md describes")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crd = yaml.load(CRD_PATH.read_text(), Loader=loader)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1beta2"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema
