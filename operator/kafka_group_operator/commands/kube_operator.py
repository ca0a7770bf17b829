"""``kgo operator``: run the Kubernetes operator (kopf) with the embedded coordinator.

Settings come from the environment (``handlers.config.OperatorConfig.from_env``), as the Helm
chart's Deployment sets them. One replica only: the coordinator is the single writer of the
state topic, so the chart uses the Recreate strategy and kopf runs standalone (no peering).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import kopf

from kafka_group_operator import handlers
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import lifecycle, logs


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
    parser.add_argument("--log-level", default="INFO")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logs.configure(args.log_level)
    try:
        config = operator_config.OperatorConfig.from_env()
    except operator_config.ConfigError as error:
        print(f"kgo operator: {error}", file=sys.stderr)
        return 2
    namespaces = list(args.namespace) or list(config.namespaces)
    handlers.load()
    memo = kopf.Memo()
    memo[lifecycle.CONFIG_KEY] = config
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not namespaces,
            namespaces=namespaces,
            liveness_endpoint=args.liveness,
            memo=memo,
        )
    )
    return 0
