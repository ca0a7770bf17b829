"""The ``/metrics`` endpoint: Prometheus's text format on a port of its own.

Apart from the member API so that scraping needs no group token and a NetworkPolicy can open
it to the monitoring namespace alone. Each scrape renders the runtime's registry
(``runtime.metrics.registry_for``): the instruments the runtime updates as it serves, and the
collectors that read group state and lag from memory at that moment.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.runtime import metrics as runtime_metrics

DEFAULT_PORT = 9090
# kafka-lag-exporter's cluster_name label; one coordinator serves one Kafka cluster.
DEFAULT_CLUSTER_NAME = "default"


def build_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(registry)
        response = web.Response(body=body)
        # CONTENT_TYPE_LATEST carries its own charset and version parameters.
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def start_server(
    runtime: coordinator_runtime.CoordinatorRuntime,
    host: str,
    port: int,
    cluster_name: str = DEFAULT_CLUSTER_NAME,
) -> web.AppRunner:
    """Serve ``runtime``'s metrics on ``host:port``; the caller cleans the runner up."""
    registry = runtime_metrics.registry_for(runtime, cluster_name)
    runner = web.AppRunner(build_app(registry), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
