"""Errors of the state topic itself, each carrying the Kafka error code that best names it.

Requests never see these: the runtime turns a failed write into a coordinator error
(``coordinator.errors``): retriable while the write may yet succeed, ``NOT_COORDINATOR`` once
another coordinator has fenced this one's writer. They surface where a caller must act, e.g.
``start()`` refusing a state topic created with the wrong settings.
"""

from __future__ import annotations

from typing import ClassVar


class StateTopicError(Exception):
    """Base of every state-topic failure."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    retriable: ClassVar[bool] = False


class StateTopicMisconfigured(StateTopicError):
    """The topic exists with settings that would lose or misplace state; it is not used."""

    code, name = 40, "INVALID_CONFIG"


class StateTopicUnavailable(StateTopicError):
    """The broker could not be reached or refused the request; trying again may work."""

    code, name, retriable = 15, "COORDINATOR_NOT_AVAILABLE", True


class WriteFailed(StateTopicError):
    """Records were not acknowledged; whether the broker kept them is unknown."""

    code, name, retriable = 15, "COORDINATOR_NOT_AVAILABLE", True

    def __init__(self, message: str, kafka_error_name: str) -> None:
        super().__init__(message)
        self.kafka_error_name = kafka_error_name


class WriterFenced(StateTopicError):
    """A newer producer with this partition's ``transactional.id`` exists: another
    coordinator holds the partition, and this one must never write to it again.

    Kafka's ``PRODUCER_FENCED`` (code 90 in ``org.apache.kafka.common.protocol.Errors``)."""

    code, name = 90, "PRODUCER_FENCED"

    def __init__(self, partition: int, message: str) -> None:
        super().__init__(message)
        self.partition = partition


class LoadFailed(StateTopicError):
    """A partition's records could not be decoded; its groups stay unavailable."""

    code, name = 2, "CORRUPT_MESSAGE"
