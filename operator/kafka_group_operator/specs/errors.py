"""Errors of the spec layer: a resource that cannot be honoured as written.

Each error carries a CamelCase ``reason`` that goes verbatim into the Ready condition, so
users and GitOps tools can match on it; the message explains what to change.
"""

from __future__ import annotations

from typing import ClassVar


class SpecError(Exception):
    """A ConsumerGroup or OffsetSnapshot spec that the operator cannot act on."""

    reason: ClassVar[str] = "InvalidSpec"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidSpec(SpecError):
    """A field is missing, malformed or out of range (what the CRD schema could not reject)."""

    reason = "InvalidSpec"


class InvalidSchedule(InvalidSpec):
    """``spec.snapshots.schedule`` has the shape of a cron line but is not a valid schedule."""

    reason = "InvalidSchedule"


class InvalidResetScope(InvalidSpec):
    """``spec.offsetReset.topics`` names a topic the group does not subscribe to, or a
    partition its topic does not have: the reset is refused rather than narrowed silently."""

    reason = "InvalidResetScope"


class InvalidTemplate(InvalidSpec):
    """The API server refused a child built from the spec (HTTP 400/422), such as an invalid
    pod template: only an edit of the resource can help."""

    reason = "InvalidTemplate"


class Forbidden(SpecError):
    """The API server forbade creating or changing a child (HTTP 403): the operator's RBAC
    lacks a rule. Retried with backoff, as fixing the RBAC does not edit the resource."""

    reason = "Forbidden"


class UnknownTopic(SpecError):
    """A subscribed topic does not exist on the Kafka cluster."""

    reason = "UnknownTopic"


class KafkaUnreachable(SpecError):
    """The bootstrap servers do not answer."""

    reason = "KafkaUnreachable"


class SecretNotFound(SpecError):
    """The Kafka Secret named by ``spec.kafka.secretRef`` does not exist."""

    reason = "SecretNotFound"
