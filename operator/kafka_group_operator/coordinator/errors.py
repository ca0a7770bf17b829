"""The coordinator's errors: one small hierarchy, each class carrying its Kafka error code.

Raised by the sans-IO handlers; the runtime and the HTTP API map them to responses by
``code``/``name`` and ``http_status``. Codes and names are Kafka's (``org.apache.kafka.common
.protocol.Errors``), so clients and operators can look them up in Kafka's documentation.
"""

from __future__ import annotations

from typing import ClassVar


class CoordinatorError(Exception):
    """Base of every error a coordinator request can fail with."""

    code: ClassVar[int] = -1
    name: ClassVar[str] = "UNKNOWN_SERVER_ERROR"
    http_status: ClassVar[int] = 500
    retriable: ClassVar[bool] = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.name)
        self.message = message or self.name

    def to_dict(self) -> dict[str, object]:
        return {"error": self.name, "code": self.code, "message": self.message}


class CoordinatorLoadInProgress(CoordinatorError):
    code, name, http_status, retriable = 14, "COORDINATOR_LOAD_IN_PROGRESS", 503, True


class CoordinatorNotAvailable(CoordinatorError):
    code, name, http_status, retriable = 15, "COORDINATOR_NOT_AVAILABLE", 503, True


class NotCoordinator(CoordinatorError):
    code, name, http_status, retriable = 16, "NOT_COORDINATOR", 503, True


class OffsetMetadataTooLarge(CoordinatorError):
    code, name, http_status = 12, "OFFSET_METADATA_TOO_LARGE", 400


class RequestTimedOut(CoordinatorError):
    code, name, http_status, retriable = 7, "REQUEST_TIMED_OUT", 503, True


class UnknownTopicOrPartition(CoordinatorError):
    code, name, http_status = 3, "UNKNOWN_TOPIC_OR_PARTITION", 400


class IllegalGeneration(CoordinatorError):
    code, name, http_status = 22, "ILLEGAL_GENERATION", 409


class UnknownMemberId(CoordinatorError):
    code, name, http_status = 25, "UNKNOWN_MEMBER_ID", 409


class InconsistentGroupProtocol(CoordinatorError):
    code, name, http_status = 23, "INCONSISTENT_GROUP_PROTOCOL", 409


class InvalidGroupId(CoordinatorError):
    code, name, http_status = 24, "INVALID_GROUP_ID", 400


class InvalidSessionTimeout(CoordinatorError):
    code, name, http_status = 26, "INVALID_SESSION_TIMEOUT", 400


class RebalanceInProgress(CoordinatorError):
    code, name, http_status, retriable = 27, "REBALANCE_IN_PROGRESS", 409, True


class InvalidCommitOffsetSize(CoordinatorError):
    code, name, http_status = 28, "INVALID_COMMIT_OFFSET_SIZE", 400


class GroupAuthorizationFailed(CoordinatorError):
    code, name, http_status = 30, "GROUP_AUTHORIZATION_FAILED", 403


class InvalidRequest(CoordinatorError):
    code, name, http_status = 42, "INVALID_REQUEST", 400


class ConflictingRequest(InvalidRequest):
    """Kafka's INVALID_REQUEST (its code and name) for a request well formed in itself that the
    group's current state refuses (a member id that exists already, a dynamic member leaving as
    a static one): over HTTP a 409 Conflict, as the other membership conflicts, not a 400,
    which says the request itself is malformed."""

    http_status = 409


class NonEmptyGroup(CoordinatorError):
    code, name, http_status = 68, "NON_EMPTY_GROUP", 409


class GroupIdNotFound(CoordinatorError):
    code, name, http_status = 69, "GROUP_ID_NOT_FOUND", 404


class MemberIdRequired(CoordinatorError):
    """JoinGroup v4+: the member must join again with the id the coordinator chose (KIP-394)."""

    code, name, http_status = 79, "MEMBER_ID_REQUIRED", 409

    def __init__(self, member_id: str) -> None:
        super().__init__(f"Rejoin with member id {member_id}.")
        self.member_id = member_id


class GroupMaxSizeReached(CoordinatorError):
    code, name, http_status = 81, "GROUP_MAX_SIZE_REACHED", 409


class FencedInstanceId(CoordinatorError):
    code, name, http_status = 82, "FENCED_INSTANCE_ID", 409


class FencedMemberEpoch(CoordinatorError):
    code, name, http_status = 110, "FENCED_MEMBER_EPOCH", 409


class UnreleasedInstanceId(CoordinatorError):
    code, name, http_status, retriable = 111, "UNRELEASED_INSTANCE_ID", 409, True


class UnsupportedAssignor(CoordinatorError):
    code, name, http_status = 112, "UNSUPPORTED_ASSIGNOR", 400


class StaleMemberEpoch(CoordinatorError):
    code, name, http_status, retriable = 113, "STALE_MEMBER_EPOCH", 409, True


class IllegalStateTransition(CoordinatorError):
    """A record would move a group or member to a state its transition table forbids.

    Raised by replay, never by request validation: it means the records themselves are
    inconsistent (a bug, or a corrupted state topic), so it is not retriable.
    """

    def __init__(self, role: str, subject: str, state: str, next_state: str, event: str) -> None:
        super().__init__(
            f"{role} {subject!r}: illegal transition {state} -> {next_state} on {event}"
        )
        self.role = role
        self.subject = subject
        self.state = state
        self.next_state = next_state
        self.event = event


class InconsistentState(CoordinatorError):
    """Replaying a record would break an invariant (e.g. a partition owned by two members)."""


ALL_ERRORS: tuple[type[CoordinatorError], ...] = (
    CoordinatorLoadInProgress,
    CoordinatorNotAvailable,
    NotCoordinator,
    OffsetMetadataTooLarge,
    RequestTimedOut,
    UnknownTopicOrPartition,
    IllegalGeneration,
    InconsistentGroupProtocol,
    InvalidGroupId,
    UnknownMemberId,
    InvalidSessionTimeout,
    RebalanceInProgress,
    InvalidCommitOffsetSize,
    GroupAuthorizationFailed,
    InvalidRequest,
    NonEmptyGroup,
    GroupIdNotFound,
    MemberIdRequired,
    GroupMaxSizeReached,
    FencedInstanceId,
    FencedMemberEpoch,
    UnreleasedInstanceId,
    UnsupportedAssignor,
    StaleMemberEpoch,
)

BY_NAME: dict[str, type[CoordinatorError]] = {error.name: error for error in ALL_ERRORS}
BY_CODE: dict[int, type[CoordinatorError]] = {error.code: error for error in ALL_ERRORS}
