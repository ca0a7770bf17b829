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


class Unreachable(KubeError):
    """The API server did not answer."""
