"""The OpenAPI document: valid OpenAPI 3.1, and complete for the routes the app serves."""

from __future__ import annotations

import re

from openapi_spec_validator import validate

from kafka_group_operator.api import app, openapi


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi.document()
    validate(document)
    assert document["openapi"].startswith("3.1")


def test_every_route_is_documented() -> None:
    documented = {
        (method.upper(), path)
        for path, item in openapi.document()["paths"].items()
        for method in item
        if method != "parameters"
    }
    served = {
        (route.method, re.sub(r"\{(\w+)\}", r"{\1}", route.resource.canonical))
        for route in app.build_app(object(), None).router.routes()  # type: ignore[arg-type]
        if route.resource is not None and route.method != "HEAD"
    }
    assert served == documented
