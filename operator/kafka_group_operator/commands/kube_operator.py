"""``kgo operator``: run the Kubernetes operator (kopf) with the embedded coordinator.

Settings come from the environment (``handlers.config.OperatorConfig.from_env``), as the Helm
chart's StatefulSet sets them. Every replica runs the coordinator for the state partitions
whose Leases it holds; kopf's handlers (the control plane) are active on one replica only.

That one is chosen by kopf's peering (``peering_for``), not by a Lease of ours: kopf can be
paused and resumed from outside only through its peering objects. Each replica's priority is
its ordinal's reverse, so replica 0 runs the handlers while it is alive and the next one
takes over once its record expires (``PEERING_LIFETIME_SECONDS`` after its last keep-alive;
at once when it stops cleanly). Peering is no lock: for a moment (a restarted replica 0
resuming before the others see it), two replicas may run handlers. That is safe because the
handlers only reach the coordinators through ``handlers.coordinator_port`` (every write is
fenced by the partition's holder), status writes carry the resourceVersion they read, and
every handler is idempotent. A single replica runs standalone (no peering objects needed).

Before anything starts (and before kopf is even imported, which takes seconds), the settings
and the Kubernetes credentials are checked: without a service account or a kubeconfig the
command ends in one line and has created nothing (no state topic, no Kafka connection).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_group_operator.commands import common
from kafka_group_operator.handlers import config as operator_config

# Where a pod's service account token is mounted (what kopf's login_with_service_account reads).
SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")

# How long a replica's peering record outlives its last keep-alive (kopf renews it 5 to 10
# seconds before that): how long the handlers pause after the active replica dies.
PEERING_LIFETIME_SECONDS = 20
# Replica n's peering priority is this minus n: the lowest ordinal alive runs the handlers.
PEERING_TOP_PRIORITY = 1000


@dataclass(frozen=True)
class Peering:
    """How kopf runs on this replica: alone, or paused unless it has the top priority."""

    standalone: bool
    name: str | None = None
    priority: int = 0


def peering_for(config: operator_config.OperatorConfig) -> Peering:
    """Standalone with one replica; else peering on the StatefulSet's name, by ordinal."""
    leases = config.leases
    if leases is None:
        return Peering(standalone=True)
    # The StatefulSet's ordinal: the replicas are listed in ordinal order.
    ordinal = leases.identities.index(leases.pod_name)
    return Peering(
        standalone=False, name=leases.statefulset, priority=PEERING_TOP_PRIORITY - ordinal
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "operator", help="run the Kubernetes operator with the embedded group coordinator"
    )
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable, globs allowed); all namespaces when absent "
        "(default: $KGO_WATCH_NAMESPACES)",
    )
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8081/healthz",
        help="liveness endpoint served by kopf",
    )
    parser.add_argument(
        "--event-loop",
        default="uvloop",
        choices=common.EVENT_LOOPS,
        help="the event loop the operator runs on (default uvloop, as kgo coordinator: its "
        "Kafka listener costs less CPU per heartbeat; asyncio: Python's own)",
    )
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=run)


def missing_credentials(
    config: operator_config.OperatorConfig, environ: dict[str, str] | None = None
) -> str | None:
    """Why kopf could not log in to Kubernetes, or None when it has credentials to try: the
    server of the settings, a pod's service account, or a kubeconfig file."""
    env = dict(os.environ) if environ is None else environ
    if config.kube_server is not None:
        return None
    if env.get("KUBERNETES_SERVICE_HOST") and SERVICE_ACCOUNT_TOKEN.is_file():
        return None
    listed = env.get("KUBECONFIG")
    paths = [Path(p) for p in listed.split(os.pathsep) if p] if listed else []
    home = env.get("HOME")
    if not listed and home:
        paths = [Path(home, ".kube", "config")]
    if any(path.is_file() for path in paths):
        return None
    where = "$KUBECONFIG (" + listed + ")" if listed else "~/.kube/config"
    return (
        "no Kubernetes credentials: not in a pod (no service account token) and no kubeconfig "
        f"at {where}; point KUBECONFIG at one (kubectl's) and retry. Nothing was started"
    )


def run(args: argparse.Namespace) -> int:
    try:
        config = operator_config.OperatorConfig.from_env()
    except operator_config.ConfigError as error:
        print(f"kgo operator: {error}", file=sys.stderr)
        return 2
    reason = missing_credentials(config)
    if reason is not None:
        print(f"kgo operator: {reason}", file=sys.stderr)
        return 1
    # Only now: kopf and the handlers take seconds to import.
    import asyncio

    import kopf

    from kafka_group_operator import handlers
    from kafka_group_operator.handlers import lifecycle, logs

    logs.configure(args.log_level)
    namespaces = list(args.namespace) or list(config.namespaces)
    handlers.load()
    memo = kopf.Memo()
    memo[lifecycle.CONFIG_KEY] = config
    peering = peering_for(config)
    settings = kopf.OperatorSettings()
    settings.peering.lifetime = PEERING_LIFETIME_SECONDS
    settings.peering.stealth = True  # keep-alives are not worth a log line each
    with asyncio.Runner(loop_factory=common.loop_factory(args.event_loop)) as runner:
        runner.run(
            kopf.operator(
                standalone=peering.standalone,
                peering_name=peering.name,
                priority=peering.priority,
                clusterwide=not namespaces,
                namespaces=namespaces,
                liveness_endpoint=args.liveness,
                memo=memo,
                settings=settings,
            )
        )
    return 0
