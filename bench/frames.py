"""Frame checks benchmark: what the bounds check (``wire.bounds``) costs, and how long the
largest allowed request holds the listener's event loop.

**Check cost**: per frame, in-process and warm, the bounds check of a body against kio's own
decode of the same body (the peer: what every frame pays anyway), for a steady
ConsumerGroupHeartbeat (the listener's hottest request) and typical requests and replies
(a commit of 4 partitions, OffsetFetch, JoinGroup, Metadata, and the replies the gateway
decodes: ApiVersions, Metadata of 10 topics, FindCoordinator). Median of 7 runs of 20,000
(2,000 for the large ones). The heartbeat's figure is also given against the listener's whole
cost per heartbeat (``bench/results/protocol.json``: the listener process's CPU time per
heartbeat, median of its rounds).

**Longest stall**: a Listener in-process on the embedded broker (no tokens) answers
DescribeGroups of 10,000 distinct groups (the most one request may name) while a task asks
the event loop to wake it every millisecond: the longest the loop was busy between two
wake-ups (this thread's CPU time: what the listener held it for) and how late it woke (wall
time: the machine's other work included; the same watch with nothing to serve, as long, is
given beside it). The peer, in the same run, is the same request served in one go (the
handler called once with all 10,000, its response encoded whole), timed as one block.

Writes ``bench/results/frames.json``; ``--quick`` runs fewer rounds.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.consumer_group_heartbeat.v1.request import ConsumerGroupHeartbeatRequest
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4.response import Coordinator, FindCoordinatorResponse
from kio.schema.join_group.v9.request import JoinGroupRequest, JoinGroupRequestProtocol
from kio.schema.metadata.v12.request import MetadataRequest, MetadataRequestTopic
from kio.schema.metadata.v12.response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from kio.schema.offset_commit.v9.request import (
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
)
from kio.schema.offset_fetch.v8.request import (
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopics,
)
from kio.serial import entity_reader
from kio.static.primitive import i32Timedelta

from kafka_group_operator.embedded import broker as embedded
from kafka_group_operator.protocol import dispatch
from kafka_group_operator.protocol import listener as protocol_listener
from kafka_group_operator.runtime import coordinator_runtime
from kafka_group_operator.wire import bounds, framing

RESULTS = Path(__file__).parent / "results" / "frames.json"
PROTOCOL = Path(__file__).parent / "results" / "protocol.json"
NO_THROTTLE = dispatch.NO_THROTTLE
UNCHANGED = i32Timedelta.parse(datetime.timedelta(milliseconds=-1))


def _bodies() -> dict[str, Any]:
    topic_id = uuid.UUID(int=7)
    brokers = tuple(
        MetadataResponseBroker(node_id=i, host=f"broker-{i}.kafka", port=9092, rack=None)
        for i in range(3)
    )
    return {
        "ConsumerGroupHeartbeat v1 (steady)": ConsumerGroupHeartbeatRequest(
            group_id="bench-protocol-1a2b3c-7",
            member_id="0123456789abcdef0123456789abcdef",
            member_epoch=5,
            rebalance_timeout=UNCHANGED,
            topic_partitions=None,
        ),
        "OffsetCommit v9 (4 partitions)": OffsetCommitRequest(
            group_id="orders",
            generation_id_or_member_epoch=5,
            member_id="0123456789abcdef0123456789abcdef",
            topics=(
                OffsetCommitRequestTopic(
                    name="orders",
                    partitions=tuple(
                        OffsetCommitRequestPartition(
                            partition_index=p, committed_offset=1000 + p, committed_metadata=""
                        )
                        for p in range(4)
                    ),
                ),
            ),
        ),
        "OffsetFetch v8 (1 group, 4 partitions)": OffsetFetchRequest(
            groups=(
                OffsetFetchRequestGroup(
                    group_id="orders",
                    topics=(
                        OffsetFetchRequestTopics(name="orders", partition_indexes=(0, 1, 2, 3)),
                    ),
                ),
            ),
            require_stable=True,
        ),
        "JoinGroup v9": JoinGroupRequest(
            group_id="orders",
            session_timeout=i32Timedelta.parse(datetime.timedelta(seconds=45)),
            rebalance_timeout=i32Timedelta.parse(datetime.timedelta(minutes=5)),
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(
                JoinGroupRequestProtocol(name="range", metadata=b"\0\3" + b"\0" * 40),
                JoinGroupRequestProtocol(name="cooperative-sticky", metadata=b"\0\3" + b"\0" * 40),
            ),
            reason=None,
        ),
        "Metadata v12 request (1 topic)": MetadataRequest(
            topics=(MetadataRequestTopic(topic_id=None, name="orders"),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        ),
        "ApiVersions v3 reply (60 APIs)": ApiVersionsResponse(
            error_code=ErrorCode.none,
            api_keys=tuple(ApiVersion(api_key=k, min_version=0, max_version=9) for k in range(60)),
            throttle_time=NO_THROTTLE,
        ),
        "Metadata v12 reply (3 brokers, 10 topics x 3)": MetadataResponse(
            throttle_time=NO_THROTTLE,
            brokers=brokers,
            cluster_id="cluster",
            controller_id=0,
            topics=tuple(
                MetadataResponseTopic(
                    error_code=ErrorCode.none,
                    name=f"topic-{t}",
                    topic_id=topic_id,
                    is_internal=False,
                    partitions=tuple(
                        MetadataResponsePartition(
                            error_code=ErrorCode.none,
                            partition_index=p,
                            leader_id=p,
                            leader_epoch=1,
                            replica_nodes=(0, 1, 2),
                            isr_nodes=(0, 1, 2),
                            offline_replicas=(),
                        )
                        for p in range(3)
                    ),
                    topic_authorized_operations=-(2**31),
                )
                for t in range(10)
            ),
        ),
        "FindCoordinator v4 reply (1 key)": FindCoordinatorResponse(
            throttle_time=NO_THROTTLE,
            coordinators=(
                Coordinator(
                    key="orders",
                    node_id=1_000_000,
                    host="127.0.0.1",
                    port=9092,
                    error_code=ErrorCode.none,
                    error_message=None,
                ),
            ),
        ),
        "DescribeGroups v5 request (10,000 groups)": DescribeGroupsRequest(
            groups=tuple(f"group-{i}" for i in range(10_000)), include_authorized_operations=False
        ),
    }


def _per_call_us(call: Callable[[], object], number: int, runs: int) -> float:
    """The median over ``runs`` of the time per call, in microseconds."""
    call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(number):
            call()
        times.append((time.perf_counter() - started) / number * 1e6)
    return statistics.median(times)


def check_costs(quick: bool) -> dict[str, Any]:
    runs = 3 if quick else 7
    costs = {}
    for name, body in _bodies().items():
        schema = type(body)
        data = framing.encode_entities([body])
        assert bounds.check(schema, data) == len(data)
        number = 20 if "10,000" in name else (2_000 if "Metadata v12 reply" in name else 20_000)
        read = entity_reader(schema)
        check_us = _per_call_us(lambda: bounds.check(schema, data), number, runs)  # noqa: B023
        kio_us = _per_call_us(lambda: read(data, 0), number, runs)  # noqa: B023
        costs[name] = {
            "bytes": len(data),
            "check_us": round(check_us, 2),
            "kio_decode_us": round(kio_us, 2),
            "check_vs_kio_decode": round(check_us / kio_us, 2),
        }
        print(f"  {name}: {json.dumps(costs[name])}", flush=True)
    return costs


async def _stall(quick: bool) -> dict[str, Any]:
    groups = protocol_listener.DEFAULT_MAX_GROUPS_PER_REQUEST
    with embedded.running_broker() as broker:
        runtime = coordinator_runtime.CoordinatorRuntime(
            coordinator_runtime.RuntimeConfig(
                bootstrap_servers=broker.bootstrap,
                topic=f"bench-frames-state-{uuid.uuid4().hex[:8]}",
                partitions=10,
            )
        )
        await runtime.start()
        served = protocol_listener.Listener(runtime, None, protocol_listener.ListenerConfig(port=0))
        await served.start()
        try:
            request = DescribeGroupsRequest(
                groups=tuple(f"stall-{i}" for i in range(groups)),
                include_authorized_operations=False,
            )
            frame = framing.encode_request(request, 1)
            reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
            rounds = []
            for _ in range(2 if quick else 4):
                late: list[float] = []
                held: list[float] = []
                done = asyncio.Event()

                async def watch(
                    late: list[float] = late, held: list[float] = held, done: asyncio.Event = done
                ) -> None:
                    # Wall time late (the machine's other work included), and this thread's
                    # CPU time between two wake-ups (what the loop itself was busy with).
                    while not done.is_set():
                        asked, cpu = time.perf_counter(), time.thread_time()
                        await asyncio.sleep(0.001)
                        late.append(time.perf_counter() - asked - 0.001)
                        held.append(time.thread_time() - cpu)

                watcher = asyncio.create_task(watch())
                started = time.perf_counter()
                writer.write(frame)
                payload = await framing.read_frame(reader, 1 << 26)
                took = time.perf_counter() - started
                done.set()
                await watcher
                assert payload is not None
                # The same watch with nothing to serve, as long: the machine's own lateness.
                idle_late: list[float] = []
                idle_done = asyncio.Event()
                idle = asyncio.create_task(watch(idle_late, [], idle_done))
                await asyncio.sleep(took)
                idle_done.set()
                await idle
                rounds.append(
                    {
                        "request_ms": took * 1000,
                        "longest_late_ms": max(late) * 1000,
                        "longest_busy_ms": max(held) * 1000,
                        "idle_longest_late_ms": max(idle_late) * 1000,
                    }
                )
            writer.close()
            # The peer: the same request in one go, one block on the loop.
            route = served._table[15]
            context = dispatch.RequestContext(
                served._services,  # type: ignore[arg-type]
                dispatch.Session(client_host="bench"),
                framing.RequestHeader(15, 5, 1),
            )
            whole = []
            for _ in range(2 if quick else 4):
                started = time.perf_counter()
                response = await route.handler(context, request)
                framing.encode_response(15, 5, 1, response)
                whole.append((time.perf_counter() - started) * 1000)
        finally:
            await served.stop()
            await runtime.stop()

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in rounds), 1)

    busy = statistics.median(r["longest_busy_ms"] for r in rounds)
    return {
        "groups": groups,
        "batch": dispatch.GROUP_BATCH,
        "rounds": len(rounds),
        "request_ms": median("request_ms"),
        "longest_loop_busy_ms": round(busy, 1),
        "longest_wake_up_late_ms": median("longest_late_ms"),
        "idle_longest_wake_up_late_ms": median("idle_longest_late_ms"),
        "in_one_go_block_ms": round(min(whole), 1),
        "busy_vs_in_one_go": round(busy / min(whole), 3),
    }


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    print("  check cost per frame", flush=True)
    costs = check_costs(quick)
    heartbeat = costs["ConsumerGroupHeartbeat v1 (steady)"]
    protocol = json.loads(PROTOCOL.read_text())
    listener_us = protocol["cpu_us_per_heartbeat"]["kafka"]["median"]
    print("  longest stall of the largest request", flush=True)
    stall = asyncio.run(_stall(quick))
    print(f"  {json.dumps(stall)}", flush=True)
    result = {
        "benchmark": "frames",
        "quick": quick,
        "machine": {
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },
        "check_cost": costs,
        "heartbeat": {
            "check_us": heartbeat["check_us"],
            "listener_us_per_heartbeat": round(listener_us, 1),
            "listener_us_source": "bench/results/protocol.json (the listener process's CPU per "
            "heartbeat, median of its rounds)",
            "check_share_of_listener": round(heartbeat["check_us"] / listener_us, 4),
            "target": "<= 0.05 of the listener's cost per heartbeat (issue 24 item 3)",
        },
        "largest_request_stall": stall,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
