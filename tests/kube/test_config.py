"""The operator's settings from its environment, and the Kafka settings directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_group_operator import cli
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.handlers import config


def test_from_env_defaults_and_values(tmp_path: Path) -> None:
    (tmp_path / "security.protocol").write_text("SASL_SSL\n")
    (tmp_path / "ca.crt").write_text("-----BEGIN CERTIFICATE-----")
    (tmp_path / "..data").mkdir()  # Secret volumes hold such entries next to the keys
    settings = config.OperatorConfig.from_env(
        {
            "KGO_BOOTSTRAP_SERVERS": "kafka:9092",
            "KGO_STATE_PARTITIONS": "12",
            "KGO_COORDINATOR_URL": "http://kgo.system.svc:8080",
            "KGO_WATCH_NAMESPACES": "shop, billing,",
            "KGO_KAFKA_CONFIG_DIR": str(tmp_path),
        }
    )
    assert settings.bootstrap_servers == "kafka:9092"
    assert settings.state_partitions == 12
    assert settings.state_topic == "kafka-group-operator.group-state"
    assert settings.namespaces == ("shop", "billing")
    assert settings.kafka_config == {
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(tmp_path / "ca.crt"),
    }
    assert settings.kube_server is None
    # The coordinator listener tells clients the member API's host unless told otherwise.
    assert settings.kafka_port == 9092
    assert settings.kafka_max_connections == 10_000
    # Metrics on their own port unless told otherwise.
    assert settings.metrics_port == 9090
    assert settings.cluster_name == "default"
    assert config.kafka_listener_host(settings) == "kgo.system.svc"


def test_kafkas_group_settings_come_from_the_environment() -> None:
    default = config.OperatorConfig.from_env({"KGO_BOOTSTRAP_SERVERS": "k:1"}).coordinator
    assert default == coordinator_config.CoordinatorConfig()
    assert default.initial_rebalance_delay_ms == 3_000  # Kafka's default
    settings = config.OperatorConfig.from_env(
        {
            "KGO_BOOTSTRAP_SERVERS": "k:1",
            "KGO_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "KGO_GROUP_CONSUMER_MIGRATION_POLICY": "Upgrade",
        }
    ).coordinator
    assert settings.initial_rebalance_delay_ms == 0
    assert settings.migration_policy is coordinator_config.MigrationPolicy.UPGRADE


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "KGO_BOOTSTRAP_SERVERS"),
        ({"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_API_PORT": "http"}, "KGO_API_PORT"),
        ({"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_KAFKA_PORT": "x"}, "KGO_KAFKA_PORT"),
        (
            {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_KAFKA_MAX_CONNECTIONS": "0"},
            "KGO_KAFKA_MAX_CONNECTIONS must be at least 1, not 0",
        ),
        ({"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_METRICS_PORT": "x"}, "KGO_METRICS_PORT"),
        ({"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_KAFKA_TLS_CERT_FILE": "c.pem"}, "go together"),
        (
            {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_KAFKA_CONFIG_DIR": "/nonexistent"},
            "does not exist",
        ),
        (
            {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_GROUP_CONSUMER_MIGRATION_POLICY": "sideways"},
            "not one of bidirectional, upgrade, downgrade, disabled",
        ),
        (
            {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_GROUP_INITIAL_REBALANCE_DELAY_MS": "-1"},
            "must be >= 0",
        ),
    ],
)
def test_bad_settings(environ: dict[str, str], message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        config.OperatorConfig.from_env(environ)


def test_operator_command_refuses_to_start_without_kafka(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("KGO_BOOTSTRAP_SERVERS", raising=False)
    assert cli.main(["operator"]) == 2
    assert "KGO_BOOTSTRAP_SERVERS" in capsys.readouterr().err


def test_generate_chart_crds_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[2]
    assert cli.main(["generate-chart-crds", "--check", "--root", str(root)]) == 0
    (tmp_path / "crds").mkdir()
    (tmp_path / "crds" / "x.yaml").write_text("kind: CustomResourceDefinition\n")
    assert cli.main(["generate-chart-crds", "--check", "--root", str(tmp_path)]) == 1
    assert "make generate" in capsys.readouterr().err
    assert cli.main(["generate-chart-crds", "--root", str(tmp_path)]) == 0
    assert cli.main(["generate-chart-crds", "--check", "--root", str(tmp_path)]) == 0


def test_the_listener_takes_its_connection_limit_from_the_settings() -> None:
    from kafka_group_operator.handlers import lifecycle

    settings = config.OperatorConfig.from_env(
        {"KGO_BOOTSTRAP_SERVERS": "k:1", "KGO_KAFKA_MAX_CONNECTIONS": "250"}
    )
    assert lifecycle.listener_config(settings, None).max_connections == 250
