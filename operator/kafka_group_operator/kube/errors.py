"""Errors of the Kubernetes API layer, wrapping the client's with the original as the cause."""

from __future__ import annotations


class KubeError(Exception):
    """A Kubernetes API call failed."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    """The object (or its kind) does not exist (HTTP 404)."""


class Conflict(KubeError):
    """The object already exists or changed meanwhile (HTTP 409)."""


class Invalid(KubeError):
    """The API server refused the object as malformed (HTTP 400 or 422): only an edit helps."""


class Forbidden(KubeError):
    """The operator's identity may not do this (HTTP 403): its RBAC lacks a rule."""


class Unreachable(KubeError):
    """The API server did not answer."""


class Expired(KubeError):
    """A watch's resourceVersion is too old (HTTP 410 Gone): list again, then watch."""
