"""The operator's settings, read once from its environment (set by the Helm chart).

A frozen value passed down through kopf's ``memo``; nothing reads the environment later.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.manifests import consumer_group
from kafka_group_operator.protocol import peers

# librdkafka needs file paths for these; the Secret mounts them as files with these names.
_FILE_PROPERTIES = {
    "ca.crt": "ssl.ca.location",
    "tls.crt": "ssl.certificate.location",
    "tls.key": "ssl.key.location",
}


class ConfigError(ValueError):
    """An operator setting is missing or malformed."""


# Failover and the members' budget (README, "Failover and the session timeout"). A replica
# that dies leaves its partitions' Leases unrenewed; the others take them once they expire
# by their view: the Lease's duration after the last renewal they saw, which they may see up
# to a round (a sixth of the duration) late when their watch is down. Then the new holder
# fences and loads (FENCE_AND_LOAD_S, a partition of 100,000 keys with a checkpoint loads in
# about 1.2 s: bench/takeover), and a member retrying against the moving coordinator is at
# most its longest backoff away (the member library's COORDINATOR_MOVING_BACKOFF_MAX_S, 1 s,
# jittered by 20%).
FENCE_AND_LOAD_S = 2.0
MEMBER_RETRY_S = 1.2
# A member keeps its partitions until half the session timeout after its last successful
# heartbeat was sent; that was up to a heartbeat interval before the failure (the
# coordinator's 3 s, or a quarter of the session when shorter, as the member heartbeats at
# least twice per half session).
HEARTBEAT_INTERVAL_S = 3.0
# The failover must fit in three quarters of that: a quarter is the margin.
FAILOVER_MARGIN = 0.25
# The smallest session timeout a ConsumerGroup may have unless the operator is told another
# (KGO_MIN_SESSION_TIMEOUT_SECONDS, the chart's groups.minSessionTimeoutSeconds): Kafka's
# group.consumer.min.session.timeout.ms. It cannot be set below the CRD's minimum.
MIN_SESSION_TIMEOUT_S = 45
CRD_MIN_SESSION_TIMEOUT_S = 6


def failover_bound_s(lease_duration_s: float) -> float:
    """The longest a replica's death leaves a group unanswered, the member's first retry
    included: the Lease, a round, the fence and load, the member's backoff."""
    return lease_duration_s * (1 + 1 / 6) + FENCE_AND_LOAD_S + MEMBER_RETRY_S


def member_budget_s(session_timeout_s: float) -> float:
    """How long after a failure a member surely still owns its partitions: half the session
    timeout after its last heartbeat, which was up to a heartbeat interval before."""
    return session_timeout_s / 2 - min(HEARTBEAT_INTERVAL_S, session_timeout_s / 4)


def failover_fits(lease_duration_s: float, session_timeout_s: float) -> bool:
    """Whether a failover fits a member's budget with the margin (FAILOVER_MARGIN)."""
    return failover_bound_s(lease_duration_s) <= (1 - FAILOVER_MARGIN) * member_budget_s(
        session_timeout_s
    )


@dataclass(frozen=True)
class LeaseConfig:
    """Partition Leases across the StatefulSet's replicas (``handlers.lease_shards``).

    On when ``KGO_REPLICAS`` is above 1 or ``KGO_LEASES`` is true. The replicas are the
    StatefulSet's pods ``<statefulset>-0`` .. ``-<replicas-1>``; this one is ``KGO_POD_NAME``
    (the chart sets it from the pod's name); ``peer_url`` (with ``{identity}``) is how
    members reach a replica, through the headless Service, and ``kafka_peer_address``
    (``KGO_KAFKA_PEER_ADDRESS``, ``host:port`` with ``{identity}``) how Kafka clients reach a
    replica's coordinator listener: FindCoordinator names the holder's, and each replica's
    listener advertises its own (by default through the headless Service, with the namespace,
    as Kafka clients run in the groups' namespaces).
    """

    namespace: str
    pod_name: str
    replicas: int
    statefulset: str
    lease_prefix: str
    peer_url: str
    # With the chart's minimum session timeout (45 s, a member's budget 19.5 s) a failover
    # takes at most 12.5 s: 7 s of margin (failover_bound_s).
    lease_duration_seconds: int = 8
    kafka_peer_address: str = "{identity}:9092"

    @property
    def identities(self) -> tuple[str, ...]:
        return tuple(f"{self.statefulset}-{index}" for index in range(self.replicas))

    def kafka_address_of(self) -> Callable[[str], peers.Address]:
        """A replica's Kafka listener address from its identity (``kafka_peer_address``)."""
        return peers.address_template(self.kafka_peer_address)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LeaseConfig | None:
        replicas = _integer(env, "KGO_REPLICAS", 1)
        wanted = env.get("KGO_LEASES", "").strip().lower() in ("1", "true", "yes")
        if replicas < 1:
            raise ConfigError(f"KGO_REPLICAS must be at least 1, not {replicas}")
        if replicas == 1 and not wanted:
            return None
        pod = (env.get("KGO_POD_NAME") or env.get("HOSTNAME") or "").strip()
        statefulset, dash, ordinal = pod.rpartition("-")
        if not dash or not ordinal.isdigit():
            raise ConfigError(
                f"KGO_POD_NAME must be a StatefulSet pod's name (<name>-<ordinal>), not {pod!r}"
            )
        if int(ordinal) >= replicas:
            raise ConfigError(f"pod {pod} is beyond KGO_REPLICAS={replicas}")
        namespace = (env.get("KGO_NAMESPACE") or "").strip()
        if not namespace:
            raise ConfigError("KGO_NAMESPACE (where the partition Leases live) is unset")
        port = _integer(env, "KGO_API_PORT", 8080)
        peer_url = env.get("KGO_PEER_URL") or f"http://{{identity}}.{statefulset}-headless:{port}"
        if "{identity}" not in peer_url:
            raise ConfigError(f"KGO_PEER_URL must contain {{identity}}, not {peer_url!r}")
        kafka_peer_address = env.get("KGO_KAFKA_PEER_ADDRESS") or (
            f"{{identity}}.{statefulset}-headless.{namespace}.svc:"
            f"{_integer(env, 'KGO_KAFKA_PORT', 9092)}"
        )
        try:
            peers.address_template(kafka_peer_address)
        except ValueError as error:
            raise ConfigError(f"KGO_KAFKA_PEER_ADDRESS: {error}") from None
        duration = _integer(env, "KGO_LEASE_DURATION_SECONDS", cls.lease_duration_seconds)
        if duration < 2:
            raise ConfigError(f"KGO_LEASE_DURATION_SECONDS must be at least 2, not {duration}")
        return cls(
            namespace=namespace,
            pod_name=pod,
            replicas=replicas,
            statefulset=statefulset,
            lease_prefix=env.get("KGO_LEASE_PREFIX") or f"{statefulset}-partition",
            peer_url=peer_url,
            lease_duration_seconds=duration,
            kafka_peer_address=kafka_peer_address,
        )


@dataclass(frozen=True)
class OperatorConfig:
    bootstrap_servers: str
    state_topic: str = "kafka-group-operator.group-state"
    state_partitions: int = 50
    replication_factor: int = 1
    min_insync_replicas: int = 1
    # Extra librdkafka settings (TLS/SASL) for the operator's own Kafka clients.
    kafka_config: Mapping[str, str] = field(default_factory=dict)
    api_host: str = "0.0.0.0"
    api_port: int = 8080
    # What consumer pods use to reach the member API (the chart's Service).
    coordinator_url: str = "http://kafka-group-operator:8080"
    # The coordinator listener (Kafka protocol) beside the member API: its port, the host it
    # tells clients (default: the host of coordinator_url; with Leases each replica's own,
    # ``LeaseConfig.kafka_peer_address``), and TLS when both files are set.
    kafka_port: int = 9092
    kafka_advertised_host: str | None = None
    kafka_tls_cert_file: str | None = None
    kafka_tls_key_file: str | None = None
    # Connections the coordinator listener serves at once (one more is closed at accept).
    kafka_max_connections: int = 10_000
    # Prometheus metrics (/metrics) on a port of their own; cluster_name labels the lag
    # series as kafka-lag-exporter's do.
    metrics_port: int = 9090
    cluster_name: str = "default"
    # Several replicas split the state partitions by Leases (None: one replica serves all).
    leases: LeaseConfig | None = None
    # The image of the gateway sidecar of ``clientProtocol: kafka`` groups (the operator's).
    gateway_image: str = "ghcr.io/kafka-group-operator/kafka-group-operator:0.1.0"
    # The gateway sidecar's resources (None: ``consumer_group.GATEWAY_RESOURCES``).
    gateway_resources: Mapping[str, Any] | None = None
    # ConsumerGroups with a shorter sessionTimeoutSeconds are refused (InvalidSpec): their
    # members would drop their partitions in a failover (``failover_fits``).
    min_session_timeout_seconds: int = MIN_SESSION_TIMEOUT_S
    status_interval_seconds: float = 10.0
    # First retry delay of a spec that may heal (doubling up to 5 minutes).
    retry_base_seconds: float = 5.0
    # How long to wait for Kafka's metadata when checking a group's topics.
    kafka_probe_timeout_seconds: float = 10.0
    # An explicit API server (out-of-cluster runs, tests); else in-cluster or kubeconfig login.
    kube_server: str | None = None
    namespaces: tuple[str, ...] = ()
    # Where the coordinator finds compaction checkpoints to start from (those of scheduled
    # compaction unless set apart); only local directories are read.
    checkpoint_uri: str | None = None
    # The replicas' shared secret for the internal API (the control plane's calls on the
    # replica coordinating a group); None: a single replica, every group served in-process.
    internal_token: str | None = None
    # Kafka's broker-level group settings (KGO_GROUP_INITIAL_REBALANCE_DELAY_MS,
    # KGO_GROUP_CONSUMER_MIGRATION_POLICY).
    coordinator: coordinator_config.CoordinatorConfig = coordinator_config.DEFAULT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorConfig:
        env = os.environ if environ is None else environ
        bootstrap = env.get("KGO_BOOTSTRAP_SERVERS", "").strip()
        if not bootstrap:
            raise ConfigError(
                "KGO_BOOTSTRAP_SERVERS (the Kafka cluster of the state topic) is unset"
            )
        config_dir = env.get("KGO_KAFKA_CONFIG_DIR")
        if bool(env.get("KGO_KAFKA_TLS_CERT_FILE")) != bool(env.get("KGO_KAFKA_TLS_KEY_FILE")):
            raise ConfigError(
                "KGO_KAFKA_TLS_CERT_FILE and KGO_KAFKA_TLS_KEY_FILE go together (listener TLS)"
            )
        leases = LeaseConfig.from_env(env)
        min_session = _integer(env, "KGO_MIN_SESSION_TIMEOUT_SECONDS", MIN_SESSION_TIMEOUT_S)
        if min_session < CRD_MIN_SESSION_TIMEOUT_S:
            raise ConfigError(
                f"KGO_MIN_SESSION_TIMEOUT_SECONDS must be at least {CRD_MIN_SESSION_TIMEOUT_S} "
                f"(the ConsumerGroup CRD's minimum), not {min_session}"
            )
        if leases is not None and not failover_fits(leases.lease_duration_seconds, min_session):
            raise ConfigError(
                f"KGO_LEASE_DURATION_SECONDS={leases.lease_duration_seconds} does not fit "
                f"KGO_MIN_SESSION_TIMEOUT_SECONDS={min_session}: a failover may take "
                f"{failover_bound_s(leases.lease_duration_seconds):.1f}s, more than three "
                f"quarters of the {member_budget_s(min_session):.1f}s a member of such a "
                "group surely keeps its partitions; shorten the Lease or raise the minimum"
            )
        return cls(
            bootstrap_servers=bootstrap,
            state_topic=env.get("KGO_STATE_TOPIC", cls.state_topic),
            state_partitions=_integer(env, "KGO_STATE_PARTITIONS", cls.state_partitions),
            replication_factor=_integer(env, "KGO_STATE_REPLICATION_FACTOR", 1),
            min_insync_replicas=_integer(env, "KGO_STATE_MIN_INSYNC_REPLICAS", 1),
            kafka_config=read_kafka_config_dir(Path(config_dir)) if config_dir else {},
            api_host=env.get("KGO_API_HOST", cls.api_host),
            api_port=_integer(env, "KGO_API_PORT", cls.api_port),
            coordinator_url=env.get("KGO_COORDINATOR_URL", cls.coordinator_url),
            kafka_port=_integer(env, "KGO_KAFKA_PORT", cls.kafka_port),
            kafka_advertised_host=env.get("KGO_KAFKA_ADVERTISED_HOST") or None,
            kafka_tls_cert_file=env.get("KGO_KAFKA_TLS_CERT_FILE") or None,
            kafka_tls_key_file=env.get("KGO_KAFKA_TLS_KEY_FILE") or None,
            kafka_max_connections=_positive(
                env, "KGO_KAFKA_MAX_CONNECTIONS", cls.kafka_max_connections
            ),
            metrics_port=_integer(env, "KGO_METRICS_PORT", cls.metrics_port),
            cluster_name=env.get("KGO_CLUSTER_NAME") or cls.cluster_name,
            leases=leases,
            min_session_timeout_seconds=min_session,
            gateway_image=env.get("KGO_GATEWAY_IMAGE") or cls.gateway_image,
            gateway_resources=_resources(env, "KGO_GATEWAY_RESOURCES"),
            status_interval_seconds=float(env.get("KGO_STATUS_INTERVAL_SECONDS", "10")),
            kube_server=env.get("KGO_KUBE_SERVER") or None,
            namespaces=tuple(
                ns.strip() for ns in env.get("KGO_WATCH_NAMESPACES", "").split(",") if ns.strip()
            ),
            checkpoint_uri=(
                env.get("KGO_CHECKPOINT_URI") or env.get("KGO_COMPACTION_STORAGE_URI") or ""
            ).strip()
            or None,
            internal_token=env.get("KGO_INTERNAL_TOKEN", "").strip() or None,
            coordinator=_coordinator_settings(env),
        )


def _coordinator_settings(env: Mapping[str, str]) -> coordinator_config.CoordinatorConfig:
    default = coordinator_config.DEFAULT
    delay = _integer(
        env, "KGO_GROUP_INITIAL_REBALANCE_DELAY_MS", default.initial_rebalance_delay_ms
    )
    if delay < 0:
        raise ConfigError(f"KGO_GROUP_INITIAL_REBALANCE_DELAY_MS must be >= 0, not {delay}")
    policy = default.migration_policy
    raw_policy = env.get("KGO_GROUP_CONSUMER_MIGRATION_POLICY", "").strip()
    if raw_policy:
        try:
            policy = coordinator_config.parse_migration_policy(raw_policy)
        except ValueError as error:
            raise ConfigError(f"KGO_GROUP_CONSUMER_MIGRATION_POLICY: {error}") from None
    return coordinator_config.CoordinatorConfig(
        initial_rebalance_delay_ms=delay, migration_policy=policy
    )


def kafka_listener_host(config: OperatorConfig) -> str:
    """The host the coordinator listener advertises: set explicitly, else the member API's."""
    return config.kafka_advertised_host or urlsplit(config.coordinator_url).hostname or "localhost"


def gateway_settings(config: OperatorConfig) -> consumer_group.GatewaySettings:
    """The gateway sidecar's settings: the operator's image and its coordinator listener."""
    settings = consumer_group.GatewaySettings(
        image=config.gateway_image,
        coordinator_address=f"{kafka_listener_host(config)}:{config.kafka_port}",
    )
    if config.gateway_resources is not None:
        settings = dataclasses.replace(settings, resources=config.gateway_resources)
    return settings


def read_kafka_config_dir(directory: Path) -> dict[str, str]:
    """librdkafka settings from a mounted Secret: one file per property, certificates by path."""
    if not directory.is_dir():
        raise ConfigError(f"the Kafka settings directory {directory} does not exist")
    settings: dict[str, str] = {}
    for path in sorted(directory.iterdir()):
        # Secret volumes hold ..data and timestamped directories next to the keys.
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.name in _FILE_PROPERTIES:
            settings[_FILE_PROPERTIES[path.name]] = str(path)
        else:
            settings[path.name] = path.read_text().strip()
    return settings


def _resources(env: Mapping[str, str], key: str) -> Mapping[str, Any] | None:
    """A container's ResourceRequirements from JSON (``{"requests": {...}, "limits":
    {...}}``); None when unset or ``{}``."""
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
    except ValueError as error:
        raise ConfigError(f"{key} must be a JSON object: {error}") from None
    if not isinstance(value, dict) or not set(value) <= {"requests", "limits"}:
        raise ConfigError(f"{key} must be a JSON object with requests and limits only")
    for part, amounts in value.items():
        if not isinstance(amounts, dict) or not all(
            isinstance(name, str)
            and isinstance(amount, str | int | float)
            and not isinstance(amount, bool)
            for name, amount in amounts.items()
        ):
            raise ConfigError(f"{key}: {part} must map resource names to quantities")
    return value or None


def _integer(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError as error:
        raise ConfigError(f"{key} must be an integer, not {raw!r}") from error


def _positive(env: Mapping[str, str], key: str, default: int) -> int:
    value = _integer(env, key, default)
    if value < 1:
        raise ConfigError(f"{key} must be at least 1, not {value}")
    return value
