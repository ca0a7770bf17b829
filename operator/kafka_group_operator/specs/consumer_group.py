"""Typed view of a ConsumerGroup resource and the validation the CRD schema cannot express.

``parse_consumer_group`` turns the raw ``spec`` mapping (as kopf hands it over) into a frozen
``ConsumerGroupSpec`` with every default applied, or raises ``errors.InvalidSpec``. The
defaults repeat the CRD's because a resource may reach the operator without the API server's
defaulting (an older CRD, a test server). Pure: no Kubernetes or Kafka access.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from croniter import CroniterError, croniter

from kafka_group_operator.specs import errors

ASSIGNORS = ("cooperative-sticky", "sticky", "range", "roundrobin", "uniform")
AUTO_OFFSET_RESETS = ("earliest", "latest", "none")
DELETION_POLICIES = ("Retain", "Delete")
# How the pods' consumers talk to the coordinator: our member library over the member API, or
# any Kafka client through the gateway sidecar (the Kafka protocol).
CLIENT_PROTOCOLS = ("library", "kafka")
# spec.assignment: who assigns partitions to classic (JoinGroup) members. Server: the
# coordinator (static ordinals, cooperative moves, scale-down release, pause and online
# resets); Client: the group's leader, as on Kafka (Streams, Connect, custom assignors).
ASSIGNMENT_MODES = ("Server", "Client")
# spec.offsets.adopt: import the native group's offsets when the coordinator has none, or never.
ADOPT_POLICIES = ("IfEmpty", "Never")

# Kafka's legal characters for topic and group names (Topic.LEGAL_CHARS).
_KAFKA_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
_HOST_PORT = re.compile(r"^[^\s,:]+:[0-9]{1,5}$")
# The name is the StatefulSet's and the headless Service's. A Service name must be a DNS-1035
# label. The StatefulSet controller labels each pod controller-revision-hash=<name>-<hash>,
# the hash up to 10 characters and a label value at most 63, so a longer name gets no pod
# at all (kubernetes/kubernetes#64023): 63 - 1 - 10 = 52. The CRD has the same two rules.
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_MAX_NAME_LENGTH = 52


@dataclass(frozen=True, slots=True)
class KafkaConnection:
    bootstrap_servers: str
    # Secret with librdkafka properties (TLS/SASL), mounted into the consumer pods.
    secret_name: str | None = None


@dataclass(frozen=True, slots=True)
class ConsumerGroupSpec:
    """A ConsumerGroup with every default applied; field names follow the CRD."""

    name: str
    namespace: str
    group_id: str
    topics: tuple[str, ...]
    replicas: int
    template: Mapping[str, Any]
    kafka: KafkaConnection
    assignor: str = "cooperative-sticky"
    session_timeout_seconds: int = 45
    rebalance_timeout_seconds: int = 300
    auto_offset_reset: str = "latest"
    offsets_retention_minutes: int = 10080
    deletion_policy: str = "Retain"
    paused: bool = False
    client_protocol: str = "library"
    assignment: str = "Server"
    # spec.offsets: the brokers' own group of the same id (see runtime.mirror).
    mirror_to_kafka: bool = True
    mirror_interval_seconds: int = 5
    adopt: str = "IfEmpty"
    # Kept raw: their behaviour belongs to the snapshot/reset handlers.
    offset_reset: Mapping[str, Any] | None = None
    snapshots: Mapping[str, Any] | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


def default_group_id(namespace: str, name: str) -> str:
    return f"{namespace}.{name}"


def parse_consumer_group(
    name: str, namespace: str, spec: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> ConsumerGroupSpec:
    """Validate ``spec`` and return its typed view; raise ``errors.InvalidSpec`` otherwise."""
    if not _DNS_1035_LABEL.match(name):
        raise errors.InvalidSpec(
            f"the name {name!r} is not a DNS-1035 label (lower-case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit)"
        )
    if len(name) > _MAX_NAME_LENGTH:
        raise errors.InvalidSpec(
            f"the name {name!r} is longer than {_MAX_NAME_LENGTH} characters; the StatefulSet's "
            "pods are labelled controller-revision-hash=<name>-<10-character hash>, at most 63"
        )
    group_id = _string(spec, "groupId", default_group_id(namespace, name))
    if not _KAFKA_NAME.match(group_id):
        raise errors.InvalidSpec(f"groupId {group_id!r} is not a legal Kafka group name")

    raw_topics = spec.get("topics")
    if not isinstance(raw_topics, list) or not raw_topics:
        raise errors.InvalidSpec("topics must be a non-empty list of topic names")
    for topic in raw_topics:
        if not isinstance(topic, str) or not _KAFKA_NAME.match(topic):
            raise errors.InvalidSpec(f"topic {topic!r} is not a legal Kafka topic name")
    if len(set(raw_topics)) != len(raw_topics):
        raise errors.InvalidSpec("topics lists a topic more than once")

    replicas = _integer(spec, "replicas", 1, minimum=0, maximum=10000)

    template = spec.get("template")
    if not isinstance(template, Mapping):
        raise errors.InvalidSpec("template (a pod template) is required")
    pod_spec = template.get("spec")
    containers = pod_spec.get("containers") if isinstance(pod_spec, Mapping) else None
    if not isinstance(containers, list) or not containers:
        raise errors.InvalidSpec("template.spec.containers must list at least one container")

    kafka = spec.get("kafka")
    if not isinstance(kafka, Mapping):
        raise errors.InvalidSpec("kafka.bootstrapServers is required")
    bootstrap = kafka.get("bootstrapServers")
    if not isinstance(bootstrap, str) or not all(
        _HOST_PORT.match(server.strip()) for server in bootstrap.split(",")
    ):
        raise errors.InvalidSpec(
            f"kafka.bootstrapServers {bootstrap!r} must be a comma-separated host:port list"
        )
    secret_ref = kafka.get("secretRef")
    secret_name: str | None = None
    if secret_ref is not None:
        if not isinstance(secret_ref, Mapping) or not isinstance(secret_ref.get("name"), str):
            raise errors.InvalidSpec("kafka.secretRef must name a Secret")
        secret_name = secret_ref["name"]

    offsets = spec.get("offsets", {})
    if not isinstance(offsets, Mapping):
        raise errors.InvalidSpec("offsets must be an object")
    offset_reset = spec.get("offsetReset")
    snapshots = spec.get("snapshots")
    client_protocol = _choice(spec, "clientProtocol", CLIENT_PROTOCOLS)
    assignment = _choice(spec, "assignment", ASSIGNMENT_MODES)
    paused = _boolean(spec, "paused")
    if assignment == "Client" and client_protocol != "kafka":
        raise errors.InvalidSpec(
            "assignment Client needs clientProtocol kafka: only Kafka clients assign as a "
            "group's leader"
        )
    if assignment == "Client" and paused:
        raise errors.InvalidSpec(
            "paused needs assignment Server: with Client the group's leader assigns, and the "
            "coordinator cannot withhold partitions"
        )
    return ConsumerGroupSpec(
        name=name,
        namespace=namespace,
        group_id=group_id,
        topics=tuple(raw_topics),
        replicas=replicas,
        template=template,
        kafka=KafkaConnection(bootstrap_servers=bootstrap, secret_name=secret_name),
        assignor=_choice(spec, "assignor", ASSIGNORS),
        session_timeout_seconds=_integer(spec, "sessionTimeoutSeconds", 45, 6, 1800),
        rebalance_timeout_seconds=_integer(spec, "rebalanceTimeoutSeconds", 300, 1, 3600),
        auto_offset_reset=_choice(spec, "autoOffsetReset", AUTO_OFFSET_RESETS, "latest"),
        offsets_retention_minutes=_integer(spec, "offsetsRetentionMinutes", 10080, 1, 5256000),
        deletion_policy=_choice(spec, "deletionPolicy", DELETION_POLICIES),
        paused=paused,
        client_protocol=client_protocol,
        assignment=assignment,
        mirror_to_kafka=_boolean(offsets, "mirrorToKafka", default=True, prefix="offsets."),
        mirror_interval_seconds=_integer(
            offsets, "mirrorIntervalSeconds", 5, 1, 3600, prefix="offsets."
        ),
        adopt=_choice(offsets, "adopt", ADOPT_POLICIES, prefix="offsets."),
        offset_reset=offset_reset if isinstance(offset_reset, Mapping) else None,
        snapshots=snapshots if isinstance(snapshots, Mapping) else None,
        labels=dict(labels or {}),
    )


def check_reset_scope(
    offset_reset: Mapping[str, Any], subscribed: Sequence[str], partitions: Mapping[str, int]
) -> None:
    """Refuse an ``offsetReset`` scoped to what the group cannot have offsets for.

    ``partitions`` is each topic's partition count on the cluster. Every topic named in
    ``offsetReset.topics`` must be subscribed to, and every listed partition must exist;
    otherwise ``InvalidResetScope`` names each offender.
    """
    problems: list[str] = []
    for item in offset_reset.get("topics") or ():
        topic = item.get("name") if isinstance(item, Mapping) else None
        if topic not in subscribed:
            problems.append(f"the group does not subscribe to topic {topic!r}")
            continue
        count = partitions.get(str(topic))
        if count is None:
            problems.append(f"topic {topic!r} does not exist")
            continue
        unknown = [p for p in item.get("partitions") or () if not 0 <= p < count]
        if unknown:
            problems.append(
                f"topic {topic!r} has {count} partitions, not {', '.join(map(str, unknown))}"
            )
    if problems:
        raise errors.InvalidResetScope(
            "offsetReset.topics cannot be reset as written: " + "; ".join(problems)
        )


# A fixed start keeps the check pure; a schedule that never fires (Feb 30) fails from any.
_SCHEDULE_CHECK_START = datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)


def parse_snapshot_schedule(schedule: object) -> str:
    """``spec.snapshots.schedule`` if it is a cron schedule that fires, else ``InvalidSchedule``.

    The CRD's pattern only checks the shape (five fields or a macro): ``"99 99 99 99 99"`` and
    ``"0 0 30 2 *"`` pass it.
    """
    if not isinstance(schedule, str) or not (
        schedule.startswith("@") or len(schedule.split()) == 5
    ):
        raise errors.InvalidSchedule(
            f"snapshots.schedule {schedule!r} must be 5 cron fields or a macro such as @daily"
        )
    try:
        croniter(schedule, _SCHEDULE_CHECK_START).get_next(datetime.datetime)
    except (CroniterError, ValueError, KeyError) as error:
        raise errors.InvalidSchedule(
            f"snapshots.schedule {schedule!r} is not a valid cron schedule: {error}"
        ) from error
    return schedule


def _string(spec: Mapping[str, Any], key: str, default: str) -> str:
    value = spec.get(key, default)
    if not isinstance(value, str) or not value:
        raise errors.InvalidSpec(f"{key} must be a non-empty string")
    return value


def _integer(
    spec: Mapping[str, Any],
    key: str,
    default: int,
    minimum: int,
    maximum: int,
    prefix: str = "",
) -> int:
    value = spec.get(key, default)
    # bool is an int in Python but never a valid count in a resource.
    if not isinstance(value, int) or isinstance(value, bool):
        raise errors.InvalidSpec(f"{prefix}{key} must be an integer")
    if not minimum <= value <= maximum:
        raise errors.InvalidSpec(
            f"{prefix}{key} must be between {minimum} and {maximum}, not {value}"
        )
    return value


def _choice(
    spec: Mapping[str, Any],
    key: str,
    choices: tuple[str, ...],
    default: str | None = None,
    prefix: str = "",
) -> str:
    value = spec.get(key, default if default is not None else choices[0])
    if value not in choices:
        raise errors.InvalidSpec(
            f"{prefix}{key} must be one of {', '.join(choices)}, not {value!r}"
        )
    return str(value)


def _boolean(spec: Mapping[str, Any], key: str, default: bool = False, prefix: str = "") -> bool:
    value = spec.get(key, default)
    if not isinstance(value, bool):
        raise errors.InvalidSpec(f"{prefix}{key} must be true or false")
    return value
