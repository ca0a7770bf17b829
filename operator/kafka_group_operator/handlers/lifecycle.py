"""Operator start, stop and login: the embedded coordinator and its member API live here.

Startup builds the ``OperatorState`` (settings, coordinator runtime, member API server and
coordinator listener (Kafka protocol), group tokens, Kubernetes client) and keeps it in kopf's
``memo``; every other handler finds it there with ``state_of(memo)``. Cleanup stops the API
and the listener first (no new requests), then the runtime (which finishes its in-flight
writes). With Leases the partitions are handed over to the other replicas before anything
stops (``LeasedShards.stop``). Login hands kopf and our Kubernetes client the same
credentials.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web

from kafka_group_operator.access import tokens
from kafka_group_operator.api import app as api_app
from kafka_group_operator.api import internal as api_internal
from kafka_group_operator.api import metrics as metrics_api
from kafka_group_operator.coordinator import lag_health
from kafka_group_operator.handlers import config as operator_config
from kafka_group_operator.handlers import coordinator_port, lease_shards, ownership
from kafka_group_operator.kube import client as kube_client
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.protocol import peers
from kafka_group_operator.runtime import coordinator_runtime

# Our own prefix, so that kopf's bookkeeping reads as ours in `kubectl get -o yaml` and diffs.
DOMAIN = "kafkagroups.io"
FINALIZER = f"{DOMAIN}/finalizer"
# kopf ignores changes of annotations under its storage prefix; a sub-domain keeps user-facing
# annotations such as kafkagroups.io/pause-reconciliation visible to the update handlers.
KOPF_PREFIX = f"kopf.{DOMAIN}"
STATE_KEY = "kafka_group_operator"
SLOT_KEY = "kafka_group_operator_slot"
CONFIG_KEY = "kafka_group_operator_config"
KUBE_KEY = "kafka_group_operator_kube"
STARTER_KEY = "kafka_group_operator_starter"
SHARDS_KEY = "kafka_group_operator_shards"


@dataclass(slots=True)
class OperatorState:
    config: operator_config.OperatorConfig
    runtime: coordinator_runtime.CoordinatorRuntime
    tokens: tokens.GroupTokens
    kube: kube_client.KubeClient
    api_runner: web.AppRunner
    # The coordinator listener (Kafka protocol) on the same runtime and tokens.
    kafka_listener: protocol_listener.Listener
    # /metrics (Prometheus) on its own port.
    metrics_runner: web.AppRunner | None = None
    # (namespace, name) -> the generation last reconciled successfully. The status daemon
    # reports only on those, so it never hides a pending change or a failure's conditions.
    reconciled: dict[tuple[str, str], int] = field(default_factory=dict)
    # (namespace, name) -> the group's window of recent commits for its lag verdict; bounded
    # per partition, dropped with the resource.
    lag_windows: dict[tuple[str, str], lag_health.GroupLagWindow] = field(default_factory=dict)
    # The control plane's port to the groups' coordinators (``coordinator_port.port_of``
    # builds it on first use: the local runtime, else the replica serving the group).
    coordinators: coordinator_port.RoutingCoordinator | None = None


def config_of(memo: Any) -> operator_config.OperatorConfig:
    """The settings: given by the caller of ``kopf.operator`` or read from the environment."""
    config = memo.get(CONFIG_KEY)
    if config is None:
        config = operator_config.OperatorConfig.from_env()
        memo[CONFIG_KEY] = config
    assert isinstance(config, operator_config.OperatorConfig)
    return config


def kube_of(memo: Any) -> kube_client.KubeClient:
    # Login may run before or after startup; whichever comes first creates the client.
    client = memo.get(KUBE_KEY)
    if client is None:
        client = kube_client.KubeClient()
        memo[KUBE_KEY] = client
    assert isinstance(client, kube_client.KubeClient)
    return client


@dataclass(slots=True)
class _Slot:
    """Where the running ``OperatorState`` appears once the coordinator has started.

    kopf hands each resource's handlers a shallow copy of the memo, taken when it first sees
    the resource; a slot placed in the memo at startup is shared by all those copies, so
    the state set later is visible to every handler.
    """

    state: OperatorState | None = None


def started(memo: Any) -> OperatorState | None:
    """The running state, or ``None`` while the coordinator starts."""
    slot = memo.get(SLOT_KEY)
    return slot.state if isinstance(slot, _Slot) else None


# Why a handler is retried while the coordinator starts (an expected wait: logged at INFO).
STARTING = "the coordinator is still starting"


def state_of(memo: Any) -> OperatorState:
    state = started(memo)
    if state is None:
        raise kopf.TemporaryError(STARTING, delay=2)
    return state


def configure_kopf(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=KOPF_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=KOPF_PREFIX, key="last-handled-configuration"
    )
    # Our own Events say what happened (posted with kopf.event, which this level does not
    # filter); kopf's per-handler log lines as Events would only add noise.
    settings.posting.level = logging.WARNING
    settings.networking.error_backoffs = [1, 2, 5, 10, 30]


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, logger: Any, **_: Any) -> None:
    """Configure kopf and start the coordinator in the background.

    The coordinator needs Kafka, which may not be up yet. Waiting for it here would keep
    kopf's liveness endpoint down and get the pod restarted over and over; instead the
    coordinator starts (and retries) in the background, handlers retry until it runs, and
    the member API (the chart's readiness probe) listens only once it does. Then every
    existing group's token is read from its Secret; until that is done the API answers
    ``COORDINATOR_LOAD_IN_PROGRESS`` for groups it has no token for yet.
    """
    configure_kopf(settings)
    config = config_of(memo)
    kube_of(memo)
    slot = _Slot()
    memo[SLOT_KEY] = slot
    memo[STARTER_KEY] = asyncio.create_task(
        _start_coordinator(config, memo, slot, logger), name="coordinator starter"
    )


async def _start_coordinator(
    config: operator_config.OperatorConfig, memo: Any, slot: _Slot, logger: Any
) -> None:
    delay = 1.0
    while True:
        runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=config.bootstrap_servers,
                topic=config.state_topic,
                partitions=config.state_partitions,
                replication_factor=config.replication_factor,
                min_insync_replicas=config.min_insync_replicas,
                kafka_config=dict(config.kafka_config),
                checkpoint_uri=config.checkpoint_uri,
                # With Leases the partitions served come and go with them.
                served_partitions=frozenset() if config.leases is not None else None,
                coordinator=config.coordinator,
            )
        )
        shards = _shards(config, kube_of(memo), runtime)
        # Not loaded until every existing group's token is read: meanwhile a group without
        # a token is answered COORDINATOR_LOAD_IN_PROGRESS (retriable), never refused. A
        # group's token this replica was not given is read from its Secret when a member
        # presents one (``ownership.TokenLookup``), so every replica authenticates every group.
        group_tokens = tokens.GroupTokens(
            loaded=False,
            source=ownership.TokenLookup(
                kube_of(memo), _owners_of(slot, runtime), config.namespaces
            ),
        )
        directory = shards.directory() if shards is not None else None
        # The internal API: the control plane (whichever replica runs it) reaches the groups
        # served here through it.
        served_here = (
            api_internal.InProcessCoordinator(runtime, group_tokens, config.kafka_config)
            if config.internal_token is not None
            else None
        )
        runner = web.AppRunner(
            api_app.build_app(runtime, group_tokens, directory, served_here, config.internal_token),
            access_log=None,
        )
        await runner.setup()
        kafka_listener = protocol_listener.Listener(
            runtime, group_tokens, listener_config(config, shards)
        )
        metrics_runner: web.AppRunner | None = None
        try:
            await runtime.start()
            if shards is not None:
                shards.start()
                memo[SHARDS_KEY] = shards
            await web.TCPSite(runner, config.api_host, config.api_port).start()
            await kafka_listener.start()
            metrics_runner = await metrics_api.start_server(
                runtime, config.api_host, config.metrics_port, config.cluster_name
            )
        except Exception as error:  # Kafka down, topic misconfigured, port taken: retry
            if shards is not None:
                await shards.stop()
            await runner.cleanup()
            await kafka_listener.stop()
            with contextlib.suppress(Exception):
                await runtime.stop()
            logger.warning("cannot start the coordinator (retry in %.0fs): %s", delay, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)
            continue
        slot.state = OperatorState(
            config=config,
            runtime=runtime,
            tokens=group_tokens,
            kube=kube_of(memo),
            api_runner=runner,
            kafka_listener=kafka_listener,
            metrics_runner=metrics_runner,
        )
        # Code holding the operator's own memo (not a per-resource copy) may read it directly.
        memo[STATE_KEY] = slot.state
        logger.info(
            "coordinator on state topic %s; member API on %s:%d, Kafka protocol on port %d, "
            "metrics on port %d",
            config.state_topic,
            config.api_host,
            config.api_port,
            config.kafka_port,
            config.metrics_port,
        )
        await ownership.keep_loading_tokens(
            kube_of(memo), runtime, group_tokens, config.namespaces, logger
        )
        return


def _owners_of(
    slot: _Slot, runtime: coordinator_runtime.CoordinatorRuntime
) -> Callable[[], ownership.GroupOwners]:
    """Who answers who owns a group id: the control plane's port (any group's coordinator)
    once the state exists, the local runtime before."""

    def owners() -> ownership.GroupOwners:
        state = slot.state
        return coordinator_port.port_of(state) if state is not None else runtime

    return owners


@kopf.on.cleanup()
async def cleanup(memo: Any, logger: Any, **_: Any) -> None:
    starter = memo.get(STARTER_KEY)
    if isinstance(starter, asyncio.Task) and not starter.done():
        starter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starter
    state = started(memo)
    if state is not None:
        shards = memo.get(SHARDS_KEY)
        if isinstance(shards, lease_shards.LeasedShards):
            # First, while the front doors still answer (NOT_COORDINATOR naming the next
            # holder): hand the partitions over, the others take them at once.
            await shards.stop()
        await state.api_runner.cleanup()
        if state.metrics_runner is not None:
            await state.metrics_runner.cleanup()
        await state.kafka_listener.stop()
        await state.runtime.stop()
        if state.coordinators is not None:
            await state.coordinators.close()
        memo[STATE_KEY] = None
        memo[SLOT_KEY] = None
        logger.info("coordinator stopped")
    await kube_of(memo).close()


def _shards(
    config: operator_config.OperatorConfig,
    kube: kube_client.KubeClient,
    runtime: coordinator_runtime.CoordinatorRuntime,
) -> lease_shards.LeasedShards | None:
    """The partition Leases' elector for ``runtime`` when several replicas share the topic."""
    leases = config.leases
    if leases is None:
        return None
    settings = lease_shards.LeaseSettings(
        namespace=leases.namespace,
        identity=leases.pod_name,
        replicas=leases.identities,
        prefix=leases.lease_prefix,
        url_template=leases.peer_url,
        lease_duration_seconds=leases.lease_duration_seconds,
    )
    return lease_shards.LeasedShards(kube, runtime, settings)


def listener_config(
    config: operator_config.OperatorConfig,
    shards: lease_shards.LeasedShards | None,
    address_of: Callable[[str], peers.Address] | None = None,
) -> protocol_listener.ListenerConfig:
    """The coordinator listener's settings. With Leases its FindCoordinator follows them
    (``LeasePeers``) and it advertises this replica's own address, not the Service's: a
    client told "this node" must come back to this replica. ``address_of`` (a replica's
    listener by identity) defaults to ``KGO_KAFKA_PEER_ADDRESS``'s template."""
    kafka_peers = None
    host, port = operator_config.kafka_listener_host(config), None
    if shards is not None and config.leases is not None:
        if address_of is None:
            address_of = config.leases.kafka_address_of()
        kafka_peers = shards.kafka_peers(address_of)
        host, port = kafka_peers.own
    return protocol_listener.ListenerConfig(
        host=config.api_host,
        port=config.kafka_port,
        advertised_host=host,
        advertised_port=port,
        peers=kafka_peers,
        certificate_file=config.kafka_tls_cert_file,
        key_file=config.kafka_tls_key_file,
        max_connections=config.kafka_max_connections,
    )


@kopf.on.login()
async def login(
    settings: kopf.OperatorSettings, memo: Any, **kwargs: Any
) -> kopf.ConnectionInfo | None:
    config = config_of(memo)
    info: kopf.ConnectionInfo | None
    if config.kube_server is not None:
        info = kopf.ConnectionInfo(server=config.kube_server, insecure=True)
    else:
        info = kopf.login_with_service_account(settings=settings, **kwargs) or (
            kopf.login_with_kubeconfig(settings=settings, **kwargs)
        )
    if info is not None:
        kube_of(memo).configure(credentials_from(info))
    return info


def credentials_from(info: kopf.ConnectionInfo) -> kube_client.Credentials:
    return kube_client.Credentials(
        server=info.server,
        ca_path=_text(info.ca_path),
        ca_data=_data(info.ca_data),
        insecure=bool(info.insecure),
        token=info.token,
        certificate_path=_text(info.certificate_path),
        certificate_data=_data(info.certificate_data),
        private_key_path=_text(info.private_key_path),
        private_key_data=_data(info.private_key_data),
    )


def _text(path: Any) -> str | None:
    return str(path) if path else None


def _data(data: str | bytes | None) -> bytes | None:
    """PEM bytes from kopf's certificate data (PEM, or base64 of PEM as in a kubeconfig)."""
    if data is None:
        return None
    raw = data.encode() if isinstance(data, str) else data
    return raw if raw.startswith(b"-----BEGIN ") else base64.b64decode(raw)


@kopf.on.probe(id="coordinator")
def coordinator_probe(memo: Any, **_: Any) -> bool:
    """Liveness detail: whether the embedded coordinator is running. A state partition that
    cannot serve until the process restarts fails the probe (kopf then answers 500), so that
    Kubernetes restarts the pod."""
    state = started(memo)
    unhealthy = state.runtime.unhealthy_partitions() if state is not None else []
    if unhealthy:
        raise kopf.PermanentError(f"state partitions {unhealthy} cannot serve until a restart")
    return state is not None
