"""The member's configuration, as the operator injects it into consumer pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_group_operator.member import config

POD_ENV = {
    "KGO_GROUP_ID": "shop.orders",
    "KGO_COORDINATOR_URL": "http://kafka-group-operator.shop.svc:8080",
    "KGO_GROUP_TOKEN": "s3cret",
    "KGO_INSTANCE_ID": "orders-2",
    "KGO_TOPICS": "orders, payments,",
    "KAFKA_BOOTSTRAP_SERVERS": "kafka:9092",
    "KGO_AUTO_OFFSET_RESET": "latest",
}


def test_from_env_reads_what_the_operator_injects() -> None:
    loaded = config.MemberConfig.from_env(POD_ENV)
    assert loaded.group_id == "shop.orders"
    assert loaded.coordinator_url == "http://kafka-group-operator.shop.svc:8080"
    assert loaded.token == "s3cret"
    assert loaded.instance_id == "orders-2"
    assert loaded.topics == ("orders", "payments")
    assert loaded.bootstrap_servers == "kafka:9092"
    assert loaded.auto_offset_reset == "latest"
    assert loaded.kafka_config == {}
    # Each process gets a fresh member id; the instance id is what survives restarts.
    assert loaded.member_id != config.MemberConfig.from_env(POD_ENV).member_id


def test_the_pod_uid_is_the_member_id_when_given() -> None:
    loaded = config.MemberConfig.from_env({**POD_ENV, "KGO_MEMBER_ID": "7c9e-uid"})
    assert loaded.member_id == "7c9e-uid"


def test_optional_timing_variables() -> None:
    loaded = config.MemberConfig.from_env(
        {**POD_ENV, "KGO_SESSION_TIMEOUT_MS": "10000", "KGO_COMMIT_INTERVAL_MS": "250"}
    )
    # Partitions are given up at half the session timeout, well before the coordinator
    # could hand them to another member.
    assert loaded.lost_after_ms == 5000
    assert loaded.commit_interval_ms == 250
    with pytest.raises(config.ConfigError, match="KGO_SESSION_TIMEOUT_MS"):
        config.MemberConfig.from_env({**POD_ENV, "KGO_SESSION_TIMEOUT_MS": "10s"})


def test_overrides_win_over_the_environment() -> None:
    loaded = config.MemberConfig.from_env(POD_ENV, commit_interval_ms=100, instance_id=None)
    assert loaded.commit_interval_ms == 100
    assert loaded.instance_id is None


@pytest.mark.parametrize(
    "missing", ["KGO_GROUP_ID", "KGO_COORDINATOR_URL", "KGO_TOPICS", "KAFKA_BOOTSTRAP_SERVERS"]
)
def test_required_variables(missing: str) -> None:
    env = {name: value for name, value in POD_ENV.items() if name != missing}
    with pytest.raises(config.ConfigError, match=missing):
        config.MemberConfig.from_env(env)


def test_invalid_values_are_refused() -> None:
    with pytest.raises(config.ConfigError, match="auto_offset_reset"):
        config.MemberConfig.from_env({**POD_ENV, "KGO_AUTO_OFFSET_RESET": "smallest"})
    with pytest.raises(config.ConfigError, match="http"):
        config.MemberConfig.from_env({**POD_ENV, "KGO_COORDINATOR_URL": "kgo:8080"})


def test_kafka_config_dir_maps_files_to_librdkafka_properties(tmp_path: Path) -> None:
    # The layout of a mounted Secret: a hidden data directory and one file per key.
    (tmp_path / "..data").mkdir()
    (tmp_path / "security.protocol").write_text("SASL_SSL\n")
    (tmp_path / "sasl.username").write_text("alice")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----")
    (tmp_path / "tls.key").write_text("key")
    loaded = config.MemberConfig.from_env({**POD_ENV, "KGO_KAFKA_CONFIG_DIR": str(tmp_path)})
    assert loaded.kafka_config == {
        "security.protocol": "SASL_SSL",
        "sasl.username": "alice",
        "ssl.ca.location": str(tmp_path / "ca.crt"),
        "ssl.key.location": str(tmp_path / "tls.key"),
    }


def test_a_missing_kafka_config_dir_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="not a directory"):
        config.read_kafka_config_dir(tmp_path / "absent")
