"""Lease mode's settings: the operator's environment, ``kgo coordinator``'s flags, the timing."""

from __future__ import annotations

import argparse

import pytest

from kafka_group_operator.commands import coordinator
from kafka_group_operator.handlers import config, lease_shards, lifecycle
from kafka_group_operator.kube import client
from kafka_group_operator.runtime import coordinator_runtime

BASE = {"KGO_BOOTSTRAP_SERVERS": "kafka:9092"}


def test_one_replica_runs_without_leases() -> None:
    assert config.OperatorConfig.from_env(BASE).leases is None
    assert config.OperatorConfig.from_env({**BASE, "KGO_REPLICAS": "1"}).leases is None


def test_replicas_of_a_statefulset_take_leases() -> None:
    settings = config.OperatorConfig.from_env(
        {
            **BASE,
            "KGO_REPLICAS": "3",
            "KGO_POD_NAME": "kgo-operator-1",
            "KGO_NAMESPACE": "kgo-system",
            "KGO_LEASE_DURATION_SECONDS": "3",
        }
    )
    leases = settings.leases
    assert leases is not None
    assert leases.identities == ("kgo-operator-0", "kgo-operator-1", "kgo-operator-2")
    assert leases.lease_prefix == "kgo-operator-partition"
    assert leases.peer_url == "http://{identity}.kgo-operator-headless:8080"
    runtime = coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig("kafka:9092", partitions=6, served_partitions=frozenset())
    )
    shards = lifecycle._shards(settings, client.KubeClient(), runtime)
    assert shards is not None
    assert shards.settings.identity == "kgo-operator-1"
    assert (
        shards.settings.url_of("kgo-operator-2")
        == "http://kgo-operator-2.kgo-operator-headless:8080"
    )
    timing = shards.elector.config
    assert (timing.lease_duration_seconds, timing.renew_deadline_seconds) == (3, 2.0)
    assert timing.retry_period_seconds == 0.5
    # The runtime asks the elector before it acknowledges anything.
    assert runtime.lease_check == shards.elector.holds
    directory = shards.directory()
    assert directory.advertised_url == "http://kgo-operator-1.kgo-operator-headless:8080"
    assert directory.owner("any-group").is_self is False  # nothing held yet
    assert directory.owner("any-group").url is None  # and nobody known
    with pytest.raises(ValueError, match="serving no partition of its own"):
        lease_shards.LeasedShards(
            client.KubeClient(),
            coordinator_runtime.CoordinatorRuntime(coordinator_runtime.RuntimeConfig("k:9092")),
            shards.settings,
        )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KGO_REPLICAS": "0"}, "KGO_REPLICAS must be at least 1"),
        ({"KGO_REPLICAS": "3", "KGO_POD_NAME": "laptop"}, "StatefulSet pod's name"),
        (
            {"KGO_REPLICAS": "3", "KGO_POD_NAME": "kgo-5", "KGO_NAMESPACE": "n"},
            "beyond KGO_REPLICAS=3",
        ),
        ({"KGO_LEASES": "true", "KGO_POD_NAME": "kgo-0"}, "KGO_NAMESPACE"),
        (
            {"KGO_REPLICAS": "2", "KGO_POD_NAME": "kgo-0", "KGO_NAMESPACE": "n",
             "KGO_PEER_URL": "http://kgo:8080"},
            "must contain {identity}",
        ),
        (
            {"KGO_REPLICAS": "2", "KGO_POD_NAME": "kgo-0", "KGO_NAMESPACE": "n",
             "KGO_LEASE_DURATION_SECONDS": "1"},
            "at least 2",
        ),
    ],
)  # fmt: skip
def test_bad_lease_settings_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.OperatorConfig.from_env({**BASE, **env})


def _args(**overrides: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "lease_namespace": "ns",
        "advertised_url": "http://a:8080",
        "lease_replicas": "http://a:8080,http://b:8080",
        "kube_server": "http://127.0.0.1:6443",
        "partitions": None,
        "peers": None,
        "lease_prefix": "kgo-partition",
        "lease_duration": 15,
        "lease_retry_period": None,
        "state_partitions": 50,
    }
    values.update(overrides)
    return argparse.Namespace(**values)


def test_kgo_coordinator_lease_flags() -> None:
    assert coordinator.read_lease_settings(_args(lease_namespace=None)) is None
    settings = coordinator.read_lease_settings(_args())
    assert isinstance(settings, lease_shards.LeaseSettings)
    assert settings.identity == "http://a:8080"
    assert settings.replicas == ("http://a:8080", "http://b:8080")
    assert settings.url_of("http://b:8080") == "http://b:8080"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"advertised_url": None}, "needs --advertised-url"),
        ({"lease_replicas": None}, "needs --lease-replicas"),
        ({"kube_server": None}, "needs --kube-server"),
        ({"partitions": "0-3"}, "no --partitions or --peers"),
        ({"lease_replicas": "http://b:8080"}, "is not among the replicas"),
        ({"lease_replicas": "http://a:8080,ftp://b"}, "--lease-replicas: 'ftp://b'"),
        ({"lease_duration": 1, "lease_retry_period": 0.6}, "greater than retry_period"),
    ],
)
def test_bad_kgo_coordinator_lease_flags(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        coordinator.read_lease_settings(_args(**overrides))


def test_the_minimum_session_timeout_and_the_lease_must_fit() -> None:
    """KGO_MIN_SESSION_TIMEOUT_SECONDS defaults to Kafka's 45 s; a Lease whose failover does
    not fit it is refused at start, as the chart refuses it at install."""
    replicas = {"KGO_REPLICAS": "3", "KGO_POD_NAME": "kgo-0", "KGO_NAMESPACE": "kgo-system"}
    assert config.OperatorConfig.from_env(BASE).min_session_timeout_seconds == 45
    settings = config.OperatorConfig.from_env({**BASE, **replicas})
    assert settings.leases is not None
    assert settings.leases.lease_duration_seconds == 8
    with pytest.raises(config.ConfigError, match="KGO_LEASE_DURATION_SECONDS=15 does not fit"):
        config.OperatorConfig.from_env({**BASE, **replicas, "KGO_LEASE_DURATION_SECONDS": "15"})
    # A longer minimum lets a longer Lease through; one replica has no Lease to fit.
    config.OperatorConfig.from_env(
        {
            **BASE,
            **replicas,
            "KGO_LEASE_DURATION_SECONDS": "15",
            "KGO_MIN_SESSION_TIMEOUT_SECONDS": "90",
        }
    )
    single = config.OperatorConfig.from_env({**BASE, "KGO_MIN_SESSION_TIMEOUT_SECONDS": "10"})
    assert single.min_session_timeout_seconds == 10
    with pytest.raises(config.ConfigError, match="at least 6"):
        config.OperatorConfig.from_env({**BASE, "KGO_MIN_SESSION_TIMEOUT_SECONDS": "5"})
