"""``kgo coordinator``: the coordinator runtime and its member API, without Kubernetes.

For local use, the demo, the multi-process tests and the benchmarks. Group settings that the
operator would take from a ConsumerGroup resource come from ``--groups FILE`` instead, a JSON
object ``{group: {"sessionTimeoutMs": ..., "heartbeatIntervalMs": ..., "assignor": ...,
"rebalanceTimeoutMs": ..., "offsetsRetentionMs": ..., "topics": [...], "mirrorToKafka": true,
"mirrorIntervalSeconds": 5}}``. As with a ConsumerGroup's ``spec.offsets``, each group of the
file has its committed offsets mirrored into the brokers' own group of the same id
(``runtime.mirror``) unless ``mirrorToKafka`` is false, at most once per
``mirrorIntervalSeconds`` (default 5); groups not in the file are not mirrored. Without
``--tokens FILE`` the API runs unauthenticated, which is logged as a warning.
``--kafka-port`` also serves the groups on the Kafka protocol (the coordinator listener),
with the same tokens as SASL/PLAIN passwords (username = group id).

Several processes can split one state topic: ``--partitions 0-24`` serves only those state
partitions (``--state-partitions`` is the topic's partition count), and the groups of the
others are answered ``NOT_COORDINATOR``. With ``--advertised-url`` and ``--peers
25-49=http://b:8080,...`` (or ``--peers @FILE``, a JSON object ``{"25-49": "http://b:8080"}``)
that answer names the group's coordinator, and ``GET /v1/groups/{group}/coordinator`` says
who it is. ``--kafka-peers 25-49=b:9092,...`` does the same for Kafka clients: the Kafka
listener's FindCoordinator names a group's coordinator by its Kafka listener.

With ``--lease-namespace`` the partitions are not fixed but follow Kubernetes Leases, one per
state partition (``handlers.lease_shards``): the processes named by ``--lease-replicas`` (their
member-API URLs, this one's ``--advertised-url`` among them) spread the partitions evenly,
and take over those of a process that stops renewing its Leases. ``--kube-server`` is the API
server's URL (plain, no credentials: for local runs and tests). With ``--kafka-port``,
``--lease-kafka-replicas`` names every replica's Kafka listener (HOST:PORT, in the order of
``--lease-replicas``): FindCoordinator then names the listener of the Lease's holder.

SIGTERM and SIGINT stop the process within ``STOP_GRACE_S``, with traffic running and with
the brokers gone. A process started together with another on the same partitions keeps
serving whichever partitions its load did not lose to the other: it never exits for that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from kafka_group_operator.access import discovery, tokens
from kafka_group_operator.commands import common, kafka_lookup
from kafka_group_operator.coordinator import config as coordinator_config
from kafka_group_operator.coordinator import messages

logger = logging.getLogger("kgo.coordinator")

# SIGTERM (or SIGINT) ends the process within this long, whatever the traffic and whether the
# brokers answer (Kubernetes waits 30 s by default before SIGKILL). The stop gives up the
# Leases, closes every connection, answers or drops what is in flight and aborts open
# transactions within ``_STEPS_S``; the exit then waits for worker threads until
# ``_WATCHDOG_S``, and no longer: a librdkafka call still waiting for brokers that are gone
# returns only at its own timeout. The watchdog fires 2.5 s before the promise: on a loaded
# machine the signal handler, the watchdog's own wake-up and the exit each wait for the CPU
# (1 s of margin was once not enough).
STOP_GRACE_S = 10.0
_STEPS_S = STOP_GRACE_S - 4.0
_WATCHDOG_S = STOP_GRACE_S - 2.5
# How long HTTP requests in flight at a stop may take to finish, and then to be cancelled
# (aiohttp waits this long for each). A commit cut short is retried at the next
# coordinator, as after a crash; it is in the log or not, never acknowledged and lost.
_HTTP_SHUTDOWN_S = 1.0

# JSON field of --groups -> GroupSettings attribute
GROUP_SETTING_FIELDS = {
    "assignor": "assignor",
    "sessionTimeoutMs": "session_timeout_ms",
    "rebalanceTimeoutMs": "rebalance_timeout_ms",
    "heartbeatIntervalMs": "heartbeat_interval_ms",
    "offsetsRetentionMs": "offsets_retention_ms",
    "topics": "topics",
}
# JSON fields of --groups that configure the offset mirror, as spec.offsets does (same
# defaults and bounds as the ConsumerGroup CRD).
MIRROR_TO_KAFKA = "mirrorToKafka"
MIRROR_INTERVAL_SECONDS = "mirrorIntervalSeconds"
DEFAULT_MIRROR_INTERVAL_SECONDS = 5
MAX_MIRROR_INTERVAL_SECONDS = 3600


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "coordinator", help="run the group coordinator and its member API standalone"
    )
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        required="KAFKA_BOOTSTRAP_SERVERS" not in os.environ,
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8080, help="port of the member API")
    parser.add_argument(
        "--kafka-port",
        type=int,
        help="also serve the groups on the Kafka protocol on this port (0: any free port)",
    )
    parser.add_argument(
        "--kafka-advertised-host", help="host Kafka clients are told to use (default: --host)"
    )
    parser.add_argument(
        "--kafka-max-connections",
        type=int,
        help="Kafka connections served at once; one more is closed as it is accepted "
        "(default 10000)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port at /metrics (0: any free port)",
    )
    parser.add_argument(
        "--cluster-name",
        default="default",
        help="the cluster_name label of the lag metrics (default: default)",
    )
    parser.add_argument("--kafka-tls-cert", type=Path, help="PEM certificate: Kafka over TLS")
    parser.add_argument("--kafka-tls-key", type=Path, help="PEM private key of --kafka-tls-cert")
    parser.add_argument("--topic", default="kafka-group-operator.group-state")
    parser.add_argument(
        "--state-partitions",
        type=int,
        default=50,
        help="partition count of the state topic (default 50)",
    )
    parser.add_argument(
        "--partitions",
        help="serve only these state partitions, e.g. 0-24,30 (default: all)",
    )
    parser.add_argument("--advertised-url", help="this process's member-API URL, as peers name it")
    parser.add_argument(
        "--peers",
        help="who serves the other state partitions: SET=URL,... (0-24=http://a:8080, "
        "a SET of several items joined by +), or @FILE with a JSON object {SET: URL}",
    )
    parser.add_argument(
        "--lease-namespace",
        help="take state partitions by Kubernetes Leases in this namespace (not with --partitions)",
    )
    parser.add_argument(
        "--lease-replicas",
        help="with --lease-namespace: every replica's member-API URL, comma-separated "
        "(this one's --advertised-url among them)",
    )
    parser.add_argument(
        "--lease-prefix", default="kgo-partition", help="Lease names are PREFIX-<partition>"
    )
    parser.add_argument(
        "--lease-duration",
        type=int,
        default=8,
        help="Lease duration in seconds (renew deadline 2/3 of it, retries every 1/6)",
    )
    parser.add_argument(
        "--lease-retry-period",
        type=float,
        help="seconds between election rounds (default: 1/6 of --lease-duration)",
    )
    parser.add_argument("--kube-server", help="the Kubernetes API server of the Leases (URL)")
    parser.add_argument(
        "--lease-kafka-replicas",
        help="with --lease-namespace and --kafka-port: every replica's Kafka listener, "
        "HOST:PORT,... in the order of --lease-replicas (FindCoordinator names the holder's)",
    )
    parser.add_argument(
        "--kafka-peers",
        help="with --partitions and --kafka-port: the Kafka listeners of the coordinators "
        "serving the other state partitions, SET=HOST:PORT,... (25-49=b:9092)",
    )
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--min-insync-replicas", type=int, default=1)
    parser.add_argument("--tokens", type=Path, help="JSON file {group: token}")
    parser.add_argument("--groups", type=Path, help="JSON file {group: settings}")
    parser.add_argument("--checkpoint", help="compaction checkpoint(s) to load from (dir, file://)")
    parser.add_argument(
        "--group-initial-rebalance-delay-ms",
        type=int,
        default=3_000,
        metavar="MS",
        help="how long a new classic group waits for more members before its first "
        "rebalance (Kafka's group.initial.rebalance.delay.ms; default 3000)",
    )
    parser.add_argument(
        "--group-consumer-migration-policy",
        default="bidirectional",
        choices=("bidirectional", "upgrade", "downgrade", "disabled"),
        help="conversions between classic and consumer groups (Kafka's "
        "group.consumer.migration.policy; default bidirectional)",
    )
    parser.add_argument(
        "--log-level", default="INFO", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR")
    )
    parser.set_defaults(func=run)


def read_directory(args: argparse.Namespace) -> discovery.Directory:
    """The partition set and peers map from the options; ValueError naming a bad one."""
    if args.state_partitions < 1:
        raise ValueError(f"--state-partitions must be >= 1, not {args.state_partitions}")
    served = None
    if args.partitions is not None:
        try:
            served = discovery.parse_partition_set(args.partitions)
        except ValueError as error:
            raise ValueError(f"--partitions: {error}") from None
    advertised = None
    if args.advertised_url is not None:
        try:
            advertised = discovery.check_url(args.advertised_url)
        except ValueError as error:
            raise ValueError(f"--advertised-url: {error}") from None
    peers: dict[int, str] = {}
    if args.peers is not None:
        spec: str = args.peers
        try:
            if spec.startswith("@"):
                peers = _read_peers_file(Path(spec[1:]))
            else:
                peers = discovery.parse_peers(spec)
        except ValueError as error:
            raise ValueError(f"--peers: {error}") from None
    try:
        return discovery.Directory(args.state_partitions, served, advertised, peers)
    except ValueError as error:
        raise ValueError(f"--partitions/--peers: {error}") from None


def read_lease_settings(args: argparse.Namespace) -> Any:
    """The Lease settings (``handlers.lease_shards.LeaseSettings``) when ``--lease-namespace`` is
    given, else None; ValueError naming the option that is wrong."""
    if args.lease_namespace is None:
        return None
    from kafka_group_operator.handlers import lease_shards

    for option, value in (
        ("--advertised-url", args.advertised_url),
        ("--lease-replicas", args.lease_replicas),
        ("--kube-server", args.kube_server),
    ):
        if not value:
            raise ValueError(f"--lease-namespace needs {option}")
    if args.partitions is not None or args.peers is not None:
        raise ValueError("--lease-namespace decides the partitions: no --partitions or --peers")
    me = discovery.check_url(args.advertised_url)
    try:
        replicas = [discovery.check_url(url.strip()) for url in args.lease_replicas.split(",")]
    except ValueError as error:
        raise ValueError(f"--lease-replicas: {error}") from None
    settings = lease_shards.LeaseSettings(
        namespace=args.lease_namespace,
        identity=me,
        replicas=tuple(replicas),
        prefix=args.lease_prefix,
        lease_duration_seconds=args.lease_duration,
        retry_period_seconds=args.lease_retry_period,
    )
    settings.elector_config(args.state_partitions)  # the timing checks
    return settings


def read_kafka_peers(args: argparse.Namespace, directory: discovery.Directory) -> Any:
    """The Kafka listener's ``KafkaPeers`` from ``--kafka-peers`` (None without it);
    ValueError naming the option."""
    if args.kafka_peers is None:
        return None
    if args.kafka_port is None or args.lease_namespace is not None:
        raise ValueError("--kafka-peers goes with --kafka-port, not with --lease-namespace")
    from kafka_group_operator.protocol import peers

    try:
        return peers.KafkaPeers(
            args.state_partitions,
            directory.served,
            peers.parse_kafka_peers(args.kafka_peers),
            own=(args.kafka_advertised_host or args.host, args.kafka_port),
        )
    except ValueError as error:
        raise ValueError(f"--kafka-peers: {error}") from None


def read_lease_kafka_replicas(args: argparse.Namespace) -> dict[str, tuple[str, int]] | None:
    """Each replica's Kafka listener by identity (member-API URL) from
    ``--lease-kafka-replicas`` (None without it); ValueError naming the option."""
    if args.lease_kafka_replicas is None:
        return None
    if args.lease_namespace is None or args.kafka_port is None:
        raise ValueError("--lease-kafka-replicas goes with --lease-namespace and --kafka-port")
    from kafka_group_operator.protocol import peers

    # As read_lease_settings names them.
    identities = [url.strip().rstrip("/") for url in (args.lease_replicas or "").split(",")]
    try:
        addresses = [peers.parse_address(a) for a in args.lease_kafka_replicas.split(",")]
    except ValueError as error:
        raise ValueError(f"--lease-kafka-replicas: {error}") from None
    if len(addresses) != len(identities):
        raise ValueError(
            f"--lease-kafka-replicas names {len(addresses)} listener(s) for "
            f"{len(identities)} --lease-replicas"
        )
    if len(set(addresses)) != len(addresses):
        raise ValueError("--lease-kafka-replicas names one listener twice")
    return dict(zip(identities, addresses, strict=True))


def _read_peers_file(path: Path) -> dict[int, str]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read {path}: {error}") from error
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise ValueError(f"{path} must hold a JSON object {{partitions: url}}")
    return discovery.parse_peers(",".join(f"{k.replace(',', '+')}={v}" for k, v in loaded.items()))


def read_group_settings(path: Path) -> list[messages.GroupSettings]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the groups file {path}: {error}") from error
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a JSON object {{group: settings}}")
    settings = []
    for group, fields in loaded.items():
        if not isinstance(fields, dict):
            raise ValueError(f"settings of group {group!r} must be an object")
        unknown = set(fields) - {*GROUP_SETTING_FIELDS, MIRROR_TO_KAFKA, MIRROR_INTERVAL_SECONDS}
        if unknown:
            raise ValueError(f"unknown settings for group {group!r}: {sorted(unknown)}")
        values = {
            GROUP_SETTING_FIELDS[name]: value
            for name, value in fields.items()
            if name in GROUP_SETTING_FIELDS
        }
        if "topics" in values:
            if not isinstance(values["topics"], list):
                raise ValueError(f"topics of group {group!r} must be a list of names")
            values["topics"] = tuple(values["topics"])
        settings.append(messages.GroupSettings(group_id=group, **values))
    return settings


def read_mirror_intervals(path: Path) -> dict[str, int | None]:
    """group -> seconds between its mirror commits, None when ``mirrorToKafka`` is false,
    for every group of the file (whose shape ``read_group_settings`` checks)."""
    loaded = json.loads(path.read_text())
    intervals: dict[str, int | None] = {}
    for group, fields in loaded.items():
        enabled = fields.get(MIRROR_TO_KAFKA, True)
        if not isinstance(enabled, bool):
            raise ValueError(f"{MIRROR_TO_KAFKA} of group {group!r} must be true or false")
        interval = fields.get(MIRROR_INTERVAL_SECONDS, DEFAULT_MIRROR_INTERVAL_SECONDS)
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int)
            or not 1 <= interval <= MAX_MIRROR_INTERVAL_SECONDS
        ):
            raise ValueError(
                f"{MIRROR_INTERVAL_SECONDS} of group {group!r} must be a whole number of "
                f"seconds from 1 to {MAX_MIRROR_INTERVAL_SECONDS}, not {interval!r}"
            )
        intervals[group] = interval if enabled else None
    return intervals


def _mirror(runtime: Any, bootstrap: str, intervals: Mapping[str, int | None]) -> None:
    """Mirror each group into the brokers the coordinator uses (``--bootstrap``)."""
    from kafka_group_operator.runtime import mirror

    for group, interval in intervals.items():
        if interval is not None:
            runtime.mirror.configure(group, mirror.MirrorTarget(bootstrap, {}, float(interval)))


async def serve(
    args: argparse.Namespace,
    token_store: tokens.GroupTokens | None,
    group_settings: list[messages.GroupSettings],
    directory: discovery.Directory,
    lease_settings: Any = None,
    mirror_intervals: Mapping[str, int | None] | None = None,
) -> None:
    # Imported here so that `kgo --help` and a wrong invocation do not load the HTTP server,
    # the Kafka client and the runtime (half a second or more).
    from aiohttp import web

    from kafka_group_operator.api import app as api_app
    from kafka_group_operator.runtime import coordinator_runtime

    if token_store is None:
        logger.warning("no --tokens file: the member API accepts requests without a token")
    runtime = coordinator_runtime.CoordinatorRuntime(
        coordinator_runtime.RuntimeConfig(
            bootstrap_servers=args.bootstrap,
            topic=args.topic,
            partitions=args.state_partitions,
            served_partitions=frozenset() if lease_settings is not None else directory.served,
            replication_factor=args.replication_factor,
            min_insync_replicas=args.min_insync_replicas,
            checkpoint_uri=args.checkpoint,
            # Serve while loading: members get COORDINATOR_LOAD_IN_PROGRESS and retry.
            wait_until_loaded=False,
            coordinator=coordinator_config.CoordinatorConfig(
                initial_rebalance_delay_ms=max(args.group_initial_rebalance_delay_ms, 0),
                migration_policy=coordinator_config.parse_migration_policy(
                    args.group_consumer_migration_policy
                ),
            ),
        )
    )
    # A signal cancels this task wherever it waits (loading too); `finally` cleans up, and a
    # watchdog ends the process if that and the exit have not within the grace period. A plain
    # signal handler, not the loop's: it runs as soon as the signal arrives, even while the
    # loop is busy (a client pipelining requests keeps it so for seconds), and the grace
    # period counts from then.
    this_task = asyncio.current_task()
    assert this_task is not None
    loop = asyncio.get_running_loop()
    signalled: list[float] = []

    def stop_soon(signum: int, frame: object) -> None:
        if not signalled:
            signalled.append(time.monotonic())
            _exit_watchdog(_WATCHDOG_S)
        with contextlib.suppress(RuntimeError):  # the loop closed already: exiting anyway
            loop.call_soon_threadsafe(this_task.cancel)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop_soon)
    shards = None
    kube = None
    configuring: asyncio.Task[None] | None = None
    if lease_settings is not None:
        from kafka_group_operator.handlers import lease_shards
        from kafka_group_operator.kube import client as kube_client

        kube = kube_client.KubeClient(kube_client.Credentials(server=args.kube_server))
        shards = lease_shards.LeasedShards(kube, runtime, lease_settings)
        directory = shards.directory()
    runner = web.AppRunner(
        api_app.build_app(runtime, token_store, directory),
        access_log=None,
        shutdown_timeout=_HTTP_SHUTDOWN_S,
    )
    await runner.setup()
    kafka_listener = None
    metrics_runner: web.AppRunner | None = None
    if args.kafka_port is not None:
        from kafka_group_operator.protocol import listener as protocol_listener

        kafka_peers = read_kafka_peers(args, directory)
        advertised: tuple[str | None, int | None] = (args.kafka_advertised_host, None)
        kafka_replicas = read_lease_kafka_replicas(args)
        if shards is not None and kafka_replicas is not None:
            # FindCoordinator follows the Leases; this listener is known by its own entry.
            from kafka_group_operator.protocol import peers

            kafka_peers = shards.kafka_peers(peers.address_map(kafka_replicas))
            advertised = kafka_peers.own
        kafka_listener = protocol_listener.Listener(
            runtime,
            token_store,
            protocol_listener.ListenerConfig(
                host=args.host,
                port=args.kafka_port,
                advertised_host=advertised[0],
                advertised_port=advertised[1],
                certificate_file=str(args.kafka_tls_cert) if args.kafka_tls_cert else None,
                key_file=str(args.kafka_tls_key) if args.kafka_tls_key else None,
                peers=kafka_peers,
                **(
                    {"max_connections": args.kafka_max_connections}
                    if args.kafka_max_connections is not None
                    else {}
                ),
            ),
        )
    try:
        await runtime.start()
        if shards is not None:
            shards.start()
        for port, start in (
            (args.port, web.TCPSite(runner, args.host, args.port).start),
            (args.kafka_port, kafka_listener.start if kafka_listener else None),
        ):
            if start is None:
                continue
            try:
                await start()
            except OSError as error:
                raise common.CommandError(
                    f"cannot listen on {args.host}:{port}: {error.strerror or error}"
                ) from None
        logger.info(
            "member API on http://%s:%d (state topic %s, partitions %s)",
            args.host,
            args.port,
            args.topic,
            "by lease"
            if shards is not None
            else "all"
            if directory.served is None
            else discovery.format_partition_set(directory.served),
        )
        if kafka_listener is not None:
            logger.info("Kafka protocol on %s:%d", args.host, kafka_listener.port)
        if args.metrics_port is not None:
            from kafka_group_operator.api import metrics as metrics_api

            try:
                metrics_runner = await metrics_api.start_server(
                    runtime, args.host, args.metrics_port, args.cluster_name
                )
            except OSError as error:
                raise common.CommandError(
                    f"cannot listen on {args.host}:{args.metrics_port}: {error.strerror or error}"
                ) from None
            logger.info(
                "metrics on http://%s:%d/metrics", args.host, metrics_runner.addresses[0][1]
            )
        await runtime.wait_until_loaded()
        if shards is None:
            # The groups of partitions served elsewhere are configured by their coordinator;
            # so are those of a partition another process took during this one's load
            # (started at the same moment on the same partitions): it has the same file.
            ours = [s for s in group_settings if directory.owner(s.group_id).is_self]
            left = await _configure_groups(runtime, ours, fence_is_final=True)
            logger.info("state loaded, %d group(s) configured", len(ours) - len(left))
            if left:
                configuring = asyncio.create_task(
                    _configure_when_held(runtime, left, fence_is_final=True)
                )
        elif group_settings:
            # The settings are state: written once by whichever process holds the group's
            # partition first, they move with the partition.
            configuring = asyncio.create_task(
                _configure_when_held(runtime, group_settings, fence_is_final=False)
            )
        # Each group is mirrored by the process serving it: with a fixed set this one's groups,
        # with Leases every group (the mirror skips one while another replica serves it).
        _mirror(
            runtime,
            args.bootstrap,
            {
                group: interval
                for group, interval in (mirror_intervals or {}).items()
                if shards is not None or directory.owner(group).is_self
            },
        )
        print(f"ready on http://{args.host}:{args.port}", flush=True)
        await asyncio.Event().wait()  # until a signal cancels us
    finally:
        # Each step gets what is left of the grace period: one that waits on a client that
        # reads nothing, or on brokers that are gone, cannot hold the others or the exit.
        stopping_at = signalled[0] if signalled else time.monotonic()
        deadline = stopping_at + _STEPS_S
        logger.info("stopping")
        if configuring is not None:
            configuring.cancel()
        if shards is not None:
            # First: give the partitions up and release their Leases for the others.
            await _within(deadline, "giving up the Leases", shards.stop())
        if kube is not None:
            await _within(deadline, "closing the Kubernetes client", kube.close())
        if kafka_listener is not None:
            # Before the member API: it cancels its connections at once, and a client
            # pipelining requests keeps the loop busy until then.
            await _within(deadline, "stopping the Kafka listener", kafka_listener.stop())
        await _within(deadline, "stopping the member API", runner.cleanup())
        if metrics_runner is not None:
            await _within(deadline, "stopping the metrics", metrics_runner.cleanup())
        await _within(deadline, "stopping the coordinator runtime", runtime.stop())
        logger.info("stopped in %.1f s", time.monotonic() - stopping_at)


async def _within(deadline: float, what: str, step: Coroutine[Any, Any, Any]) -> None:
    """Await one step of the stop until ``deadline`` (``time.monotonic()``, the loop's clock);
    a step that fails or runs out of time is logged and left behind."""
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout_at(deadline):
            await step
        logger.debug("%s: %.2f s", what, asyncio.get_running_loop().time() - started)
    except TimeoutError:
        logger.warning("%s did not finish within the stop's grace period", what)
    except Exception:
        logger.exception("%s failed", what)


def _exit_watchdog(grace_s: float) -> None:
    """End the process ``grace_s`` from now if it still runs then (started once).

    The stop itself is bounded (``_within``), but the exit waits for every worker thread, and
    a thread inside a blocking librdkafka call (a transaction commit, a metadata request)
    returns only at that call's own timeout, which may be longer while the brokers are away.
    Nothing is lost by not waiting: nothing was acknowledged that is not in the log, and a
    transaction left open is aborted by the next writer's fencing or its timeout."""
    global _watchdog
    if _watchdog is not None:
        return

    def watch() -> None:
        time.sleep(grace_s)
        me = threading.current_thread()
        waiting = sorted(t.name for t in threading.enumerate() if t is not me)
        logger.warning(
            "still stopping after %.1f s; exiting without waiting for %s", grace_s, waiting
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(0)

    _watchdog = threading.Thread(target=watch, name="stop-watchdog", daemon=True)
    _watchdog.start()


_watchdog: threading.Thread | None = None


async def _configure_when_held(
    runtime: Any, group_settings: list[messages.GroupSettings], fence_is_final: bool
) -> None:
    """Configure each group once this process serves its partition (see ``_configure_groups``),
    trying again every half second."""
    left = list(group_settings)
    while left:
        await asyncio.sleep(0.5)
        left = await _configure_groups(runtime, left, fence_is_final)


async def _configure_groups(
    runtime: Any, group_settings: list[messages.GroupSettings], fence_is_final: bool
) -> list[messages.GroupSettings]:
    """Configure the groups whose state partitions this process serves; the groups still to
    configure. A refusal (a load under way, the partition lost meanwhile) is retried later,
    never raised: a coordinator serves whatever partitions it holds. With fixed partition sets
    (``fence_is_final``) a partition fenced by another coordinator is that one's for good,
    and so is configuring its groups; under Leases it may come back."""
    from kafka_group_operator.coordinator import errors
    from kafka_group_operator.runtime import coordinator_runtime

    fenced = coordinator_runtime.PartitionState.FENCED
    left = []
    for settings in group_settings:
        if fence_is_final and runtime.partition_state(settings.group_id) is fenced:
            logger.info(
                "group %s: its state partition is served by another coordinator, which "
                "configures it",
                settings.group_id,
            )
            continue
        if not runtime.serving(runtime.partition_of(settings.group_id)):
            left.append(settings)
            continue
        try:
            await runtime.configure_group(settings)
        except errors.CoordinatorError as error:
            logger.info("group %s not configured yet: %s", settings.group_id, error)
            left.append(settings)
            continue
        logger.info("group %s configured", settings.group_id)
    return left


def run(args: argparse.Namespace) -> int:
    # The files are read before anything starts: a wrong path is one line, not a traceback.
    try:
        token_store = tokens.GroupTokens.from_file(args.tokens) if args.tokens else None
        group_settings = read_group_settings(args.groups) if args.groups is not None else []
        mirror_intervals = read_mirror_intervals(args.groups) if args.groups is not None else {}
        directory = read_directory(args)
        lease_settings = read_lease_settings(args)
        read_kafka_peers(args, directory)  # checked now: a wrong one is one line
        read_lease_kafka_replicas(args)
    except (ValueError, TypeError) as error:
        raise common.UsageError(str(error)) from None
    if not 0 < args.port < 65536:
        raise common.UsageError(f"--port must be between 1 and 65535, not {args.port}")
    if args.metrics_port is not None and not 0 <= args.metrics_port < 65536:
        raise common.UsageError(
            f"--metrics-port must be between 0 and 65535, not {args.metrics_port}"
        )
    if args.kafka_port is not None and not 0 <= args.kafka_port < 65536:
        raise common.UsageError(f"--kafka-port must be between 0 and 65535, not {args.kafka_port}")
    if args.kafka_max_connections is not None and args.kafka_max_connections < 1:
        raise common.UsageError(
            f"--kafka-max-connections must be at least 1, not {args.kafka_max_connections}"
        )
    if (args.kafka_tls_cert is None) != (args.kafka_tls_key is None):
        raise common.UsageError("--kafka-tls-cert and --kafka-tls-key go together")
    for option, path in (
        ("--kafka-tls-cert", args.kafka_tls_cert),
        ("--kafka-tls-key", args.kafka_tls_key),
    ):
        if path is not None and not path.is_file():
            raise common.UsageError(f"{option}: {path} is not a readable file")
    # Kafka must answer before the runtime's clients start: unreachable, that is one line
    # instead of their connection errors, logged on every retry.
    with kafka_lookup.lookup(args.bootstrap) as kafka:
        kafka.check_reachable()
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from kafka_group_operator.runtime import errors as runtime_errors

    try:
        with contextlib.suppress(asyncio.CancelledError):
            asyncio.run(
                serve(
                    args, token_store, group_settings, directory, lease_settings, mirror_intervals
                )
            )
    except runtime_errors.StateTopicError as error:
        raise common.CommandError(f"{type(error).__name__}: {error}") from None
    return 0
