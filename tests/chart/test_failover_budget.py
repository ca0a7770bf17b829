"""The chart refuses Lease settings whose failover does not fit the groups' shortest session
timeout, by the same rule the operator checks at start (``handlers.config.failover_fits``).

A replica's failover (the Lease, a round, the fence and load, the member's retry) must fit
three quarters of the time a member surely keeps its partitions (half its session timeout
less a heartbeat interval). Rendered over a grid of Lease durations and minimum session
timeouts, the chart accepts exactly what the operator accepts; the defaults fit with the
margin the docs state, and the old default Lease (15 s) does not fit the default minimum.
"""

from __future__ import annotations

import subprocess

import pytest

from kafka_group_operator.handlers import config as operator_config
from tests.chart.test_chart import CHART, HELM, REQUIRED, _find, _render


def _renders(lease: int, session: int, replicas: int = 3) -> tuple[bool, str]:
    done = subprocess.run(
        [
            str(HELM),
            "template",
            "kgo",
            str(CHART),
            "--namespace",
            "kgo-system",
            *REQUIRED,
            "--set",
            f"leases.durationSeconds={lease}",
            "--set",
            f"groups.minSessionTimeoutSeconds={session}",
            "--set",
            f"replicas={replicas}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0, done.stderr


@pytest.mark.parametrize("session", [6, 20, 30, 45, 60, 120])
def test_the_chart_accepts_what_the_operator_accepts(session: int) -> None:
    for lease in (2, 3, 4, 5, 6, 8, 9, 10, 15, 30, 60):
        fits = operator_config.failover_fits(lease, session)
        rendered, error = _renders(lease, session)
        assert rendered == fits, (lease, session, error)
        if not fits:
            assert f"leases.durationSeconds={lease} does not fit" in error
            assert f"groups.minSessionTimeoutSeconds={session}" in error
        # The operator refuses the same settings from its environment.
        env = {
            "KGO_BOOTSTRAP_SERVERS": "k:1",
            "KGO_REPLICAS": "3",
            "KGO_POD_NAME": "kgo-0",
            "KGO_NAMESPACE": "kgo-system",
            "KGO_LEASE_DURATION_SECONDS": str(lease),
            "KGO_MIN_SESSION_TIMEOUT_SECONDS": str(session),
        }
        if fits:
            operator_config.OperatorConfig.from_env(env)
        else:
            with pytest.raises(operator_config.ConfigError, match="does not fit"):
                operator_config.OperatorConfig.from_env(env)


def test_the_defaults_fit_with_the_stated_margin() -> None:
    docs = _render(*REQUIRED)
    (container,) = _find(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    lease = int(env["KGO_LEASE_DURATION_SECONDS"])
    session = int(env["KGO_MIN_SESSION_TIMEOUT_SECONDS"])
    assert (lease, session) == (8, 45)
    # The README's figures: at most 12.5 s of failover against 19.5 s, 7 s to spare.
    assert round(operator_config.failover_bound_s(lease), 1) == 12.5
    assert operator_config.member_budget_s(session) == 19.5
    assert operator_config.failover_fits(lease, session)
    # The Lease of before does not fit; one replica has no failover to fit.
    assert _renders(15, 45)[0] is False
    assert _renders(15, 45, replicas=1)[0] is True
    # The operator's own default Lease is the chart's.
    assert operator_config.LeaseConfig.lease_duration_seconds == lease


@pytest.mark.parametrize("session", [5, 1801])
def test_the_minimum_session_timeout_is_within_the_crds_bounds(session: int) -> None:
    rendered, error = _renders(8, session)
    assert not rendered
    assert "minSessionTimeoutSeconds" in error
