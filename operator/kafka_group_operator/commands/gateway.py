"""``kgo gateway``: the Kafka-protocol gateway next to an unmodified Kafka client.

The client bootstraps at ``--host:--port`` (plaintext, loopback); the gateway reaches the
brokers with the librdkafka properties of ``--kafka-config-dir`` (TLS, SASL) and the
operator's coordinator listener as the group (``--group-id``, ``--token``). In a pod with
``spec.clientProtocol: kafka`` the operator sets everything through the environment.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import ssl
from pathlib import Path
from typing import Any

from kafka_group_operator.commands import common

logger = logging.getLogger("kgo.gateway")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gateway",
        help="proxy an unmodified Kafka client to the brokers and the group coordinator",
    )
    env = os.environ.get
    parser.add_argument(
        "--bootstrap",
        default=env("KGO_UPSTREAM_BOOTSTRAP_SERVERS"),
        help="the brokers (default: $KGO_UPSTREAM_BOOTSTRAP_SERVERS)",
    )
    parser.add_argument(
        "--coordinator",
        default=env("KGO_COORDINATOR_KAFKA_ADDRESS"),
        help="the coordinator listener, host:port (default: $KGO_COORDINATOR_KAFKA_ADDRESS)",
    )
    parser.add_argument(
        "--coordinator-ca",
        type=Path,
        default=env("KGO_COORDINATOR_CA_FILE") or None,
        help="CA file: reach the coordinator listener over TLS (default: $KGO_COORDINATOR_CA_FILE)",
    )
    parser.add_argument(
        "--group-id", default=env("KGO_GROUP_ID"), help="the group (default: $KGO_GROUP_ID)"
    )
    parser.add_argument(
        "--token",
        default=env("KGO_GROUP_TOKEN"),
        help="the group's token, for the coordinator listener (default: $KGO_GROUP_TOKEN)",
    )
    parser.add_argument(
        "--kafka-config-dir",
        type=Path,
        default=env("KGO_KAFKA_CONFIG_DIR") or None,
        help="librdkafka properties toward the brokers, one file each ($KGO_KAFKA_CONFIG_DIR)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port",
        type=int,
        default=int(env("KGO_GATEWAY_PORT") or 9092),
        help="the client's bootstrap port (default: $KGO_GATEWAY_PORT or 9092)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="open client connections per gateway port; more are closed as they come "
        "(default: $KGO_GATEWAY_MAX_CONNECTIONS or 256)",
    )
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    parser.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> Any:
    """The ``GatewayConfig`` of the command line; ``UsageError`` for what is missing or bad."""
    from kafka_group_operator.member import config as member_config
    from kafka_group_operator.protocol import gateway
    from kafka_group_operator.wire import connection

    if not args.bootstrap:
        raise common.UsageError("--bootstrap is required (or KGO_UPSTREAM_BOOTSTRAP_SERVERS)")
    if not args.coordinator:
        raise common.UsageError("--coordinator is required (or KGO_COORDINATOR_KAFKA_ADDRESS)")
    if bool(args.group_id) != bool(args.token):
        raise common.UsageError("--group-id and --token go together (SASL to the coordinator)")
    try:
        properties = (
            member_config.read_kafka_config_dir(args.kafka_config_dir)
            if args.kafka_config_dir
            else {}
        )
        brokers = connection.upstream_security(properties)
    except (member_config.ConfigError, connection.ConfigError) as error:
        raise common.UsageError(f"--kafka-config-dir: {error}") from None
    try:
        bootstrap = connection.parse_servers(args.bootstrap)
    except connection.ConfigError as error:
        raise common.UsageError(f"--bootstrap: {error}") from None
    try:
        coordinator = connection.parse_servers(args.coordinator)
    except connection.ConfigError as error:
        raise common.UsageError(f"--coordinator: {error}") from None
    if len(coordinator) != 1:
        raise common.UsageError(f"--coordinator takes one host:port, not {args.coordinator!r}")
    try:
        tls = connection.tls_context(str(args.coordinator_ca)) if args.coordinator_ca else None
    except (OSError, ssl.SSLError) as error:
        raise common.UsageError(f"--coordinator-ca: {error}") from None
    sasl = connection.Sasl("PLAIN", args.group_id, args.token) if args.group_id else None
    limit = args.max_connections
    if limit is None:
        limit_text = os.environ.get("KGO_GATEWAY_MAX_CONNECTIONS") or str(gateway.MAX_CONNECTIONS)
        if not limit_text.isdigit():
            raise common.UsageError(f"KGO_GATEWAY_MAX_CONNECTIONS: {limit_text!r} is no number")
        limit = int(limit_text)
    if limit < 1:
        raise common.UsageError(f"--max-connections must be at least 1, not {limit}")
    return gateway.GatewayConfig(
        bootstrap_servers=bootstrap,
        coordinator=coordinator[0],
        brokers_security=brokers,
        coordinator_security=connection.Security(tls, sasl),
        host=args.host,
        port=args.port,
        max_connections=limit,
    )


async def serve(config: Any) -> None:
    from kafka_group_operator.protocol import gateway

    this_task = asyncio.current_task()
    assert this_task is not None
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, this_task.cancel)
    served = gateway.Gateway(config)
    try:
        await served.start()
    except OSError as error:
        raise common.CommandError(
            f"cannot listen on {config.host}:{config.port}: {error}"
        ) from None
    logger.info("gateway on %s:%s", config.host, served.port)
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        logger.info("stopping")
    finally:
        with contextlib.suppress(Exception):
            await served.stop()


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(message)s")
    config = build_config(args)
    import uvloop

    # The gateway is a copy loop sharing the client's cores: uvloop's event loop forwards
    # Fetch replies measurably faster than asyncio's own (bench/gateway).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(config))
    return 0
