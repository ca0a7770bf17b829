"""How a member finds its group, its coordinator and its Kafka cluster.

In a consumer pod everything comes from the environment the operator injects:

==========================  =================================================================
``KGO_GROUP_ID``            the consumer group id
``KGO_COORDINATOR_URL``     the operator's member API, e.g. ``http://kafka-group-operator:8080``
``KGO_GROUP_TOKEN``         the group's bearer token (from the group's Secret)
``KGO_INSTANCE_ID``         the pod name (downward API): the member's static identity
``KGO_MEMBER_ID``           the pod UID (downward API); optional, see below
``KGO_TOPICS``              comma-separated topic names
``KAFKA_BOOTSTRAP_SERVERS`` the brokers to fetch from
``KGO_AUTO_OFFSET_RESET``   ``earliest`` or ``latest``, for partitions without a commit
``KGO_KAFKA_CONFIG_DIR``    a directory of librdkafka properties, one file per property
``KGO_SESSION_TIMEOUT_MS``  optional: the group's session timeout; the member gives its
                            partitions up after half of it without a heartbeat
``KGO_COMMIT_INTERVAL_MS``  optional: how often processed offsets are committed
==========================  =================================================================

Outside Kubernetes, build a ``MemberConfig`` directly.

The member id is the pod UID when given, else a random UUID per process. The pod UID survives
a container restart inside the same pod (a crash, an OOM kill), so the restarted process
rejoins as the *same* member and gets its partitions back at once, while a new pod is a new
member that takes over the instance id once its predecessor left or expired.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

# Files of a Kubernetes TLS Secret, mounted into the Kafka config directory, and the
# librdkafka properties that take their paths.
TLS_FILES = {
    "ca.crt": "ssl.ca.location",
    "tls.crt": "ssl.certificate.location",
    "tls.key": "ssl.key.location",
}
AUTO_OFFSET_RESETS = ("earliest", "latest")


class ConfigError(ValueError):
    """The member's configuration is missing or invalid."""


@dataclass(frozen=True)
class MemberConfig:
    group_id: str
    coordinator_url: str
    topics: tuple[str, ...]
    bootstrap_servers: str
    token: str | None = None
    instance_id: str | None = None
    auto_offset_reset: str = "earliest"
    # Extra librdkafka properties for the fetching consumer (TLS, SASL, tuning).
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    rack: str | None = None
    # Chosen by the member, as KIP-1082 has clients do: the pod UID, or a fresh UUID.
    member_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    rebalance_timeout_ms: int = 60_000
    commit_interval_ms: int = 5_000
    # Ownership is provably fresh for this long after the last successful heartbeat was sent:
    # past that, the member hands out nothing more and gives its partitions up (no zombie
    # work). Keep it well below the group's session timeout (Kafka's default is 45 s), so the
    # partitions are given up before the coordinator hands them to someone else.
    lost_after_ms: int = 30_000
    # The longest wait for any coordinator call; a heartbeat waits less while the member holds
    # partitions: never past the moment ownership stops being fresh.
    request_timeout_s: float = 10.0
    poll_timeout_s: float = 0.1
    # How many messages iterating the member fetches at a time (Kafka's max.poll.records):
    # its checks and bookkeeping are per batch, so the cost per message is small.
    max_poll_records: int = 500

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ConfigError("group_id is required")
        if not self.coordinator_url.startswith(("http://", "https://")):
            raise ConfigError(f"coordinator_url must be an http(s) URL: {self.coordinator_url!r}")
        if not self.topics or not all(self.topics):
            raise ConfigError("at least one topic is required")
        if not self.bootstrap_servers:
            raise ConfigError("bootstrap_servers is required")
        if self.lost_after_ms <= 0 or self.commit_interval_ms <= 0:
            raise ConfigError("lost_after_ms and commit_interval_ms must be positive")
        if self.max_poll_records < 1:
            raise ConfigError("max_poll_records must be at least 1")
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise ConfigError(f"auto_offset_reset must be one of {AUTO_OFFSET_RESETS}")

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> MemberConfig:
        """The configuration the operator injects into consumer pods; ``overrides`` win."""
        env = os.environ if environ is None else environ

        def required(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise ConfigError(f"environment variable {name} is not set")
            return value

        config_dir = env.get("KGO_KAFKA_CONFIG_DIR", "").strip()
        values: dict[str, object] = {
            "group_id": required("KGO_GROUP_ID"),
            "coordinator_url": required("KGO_COORDINATOR_URL"),
            "topics": tuple(
                topic.strip() for topic in required("KGO_TOPICS").split(",") if topic.strip()
            ),
            "bootstrap_servers": required("KAFKA_BOOTSTRAP_SERVERS"),
            "token": env.get("KGO_GROUP_TOKEN") or None,
            "instance_id": env.get("KGO_INSTANCE_ID") or None,
            **({"member_id": env["KGO_MEMBER_ID"]} if env.get("KGO_MEMBER_ID") else {}),
            "auto_offset_reset": env.get("KGO_AUTO_OFFSET_RESET") or "earliest",
            "kafka_config": read_kafka_config_dir(Path(config_dir)) if config_dir else {},
        }
        # name -> (field, divisor): partitions are given up at half the session timeout.
        timings = {
            "KGO_SESSION_TIMEOUT_MS": ("lost_after_ms", 2),
            "KGO_COMMIT_INTERVAL_MS": ("commit_interval_ms", 1),
        }
        for name, (field_name, divisor) in timings.items():
            if env.get(name):
                try:
                    values[field_name] = int(env[name]) // divisor
                except ValueError:
                    raise ConfigError(f"{name} must be a number of milliseconds") from None
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def read_kafka_config_dir(directory: Path) -> dict[str, str]:
    """librdkafka properties from a mounted Secret: one file per property.

    A file's name is the property and its content the value, except TLS files (``ca.crt``,
    ``tls.crt``, ``tls.key``) whose *path* is given to librdkafka. Kubernetes adds hidden
    ``..data`` entries to mounted volumes; those are skipped.
    """
    if not directory.is_dir():
        raise ConfigError(f"KGO_KAFKA_CONFIG_DIR {directory} is not a directory")
    properties: dict[str, str] = {}
    for entry in sorted(directory.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        if entry.name in TLS_FILES:
            properties[TLS_FILES[entry.name]] = str(entry)
        else:
            properties[entry.name] = entry.read_text().strip()
    return properties
