"""Starts and stops Apache Kafka, the reference broker: one KRaft node (broker and controller in
one process) or a cluster of such nodes, on free loopback ports.

Kafka's jars come from Maven Central once per machine: ``mvn dependency:copy-dependencies`` on
``kafka-pom.xml`` into ``$XDG_CACHE_HOME/kafka-group-operator/kafka-<version>/lib``, under a
file lock so that parallel processes (test workers) fetch once. A node's log folder is
formatted with Kafka's StorageTool, then ``kafka.Kafka`` runs with a bounded heap.

Start-up is tuned for tests (``fast=True``): the JVM stops at the C1 compiler and maps a
class-data archive of Kafka's classes, which the first node to stop cleanly on a machine
writes; group rebalances start at once and internal topics have one replica per node up to
three. A node is ready when it answers a metadata request listing every node of its cluster.
Benchmarks pass ``fast=False`` for the JVM's full compiler and a larger heap.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kafka_group_operator.embedded import broker as embedded

KAFKA_VERSION = "4.4.0"
BROKER_MAIN = "kafka.Kafka"
STORAGE_TOOL = "kafka.tools.StorageTool"
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"
FETCH_TIMEOUT_S = 900.0
STOP_TIMEOUT_S = 30.0

LOG_CONFIG = """\
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
"""


# ------------------------------------------------------------------------------ the jars


def cache_root() -> Path:
    """This machine's cache of this Kafka version (jars, class-data archives)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kafka-group-operator" / f"kafka-{KAFKA_VERSION}"


def pom() -> Path:
    return Path(__file__).with_name("kafka-pom.xml")


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise embedded.BrokerError(
            "Apache Kafka needs Java 17 or later (apt-get install openjdk-17-jre-headless)"
        )
    return found


def distribution() -> Path:
    """The folder of Kafka's jars, fetched first when this machine has none."""
    root = cache_root()
    lib = root / "lib"
    if (lib / ".complete").exists():
        return lib
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (lib / ".complete").exists():
            _fetch(lib)
    return lib


def _fetch(lib: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise embedded.BrokerError(
            f"fetching Apache Kafka {KAFKA_VERSION} needs Maven once (apt-get install maven)"
        )
    staging = lib.with_name("lib.partial")
    shutil.rmtree(staging, ignore_errors=True)
    command = [
        mvn,
        "--quiet",
        "--batch-mode",
        "--file",
        str(pom()),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={staging}",
        "-DincludeScope=runtime",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise embedded.BrokerError(
            f"fetching Apache Kafka {KAFKA_VERSION} took over {FETCH_TIMEOUT_S:.0f}s"
        ) from None
    if done.returncode != 0 or not (staging / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise embedded.BrokerError(f"could not fetch Apache Kafka {KAFKA_VERSION}:\n{tail}")
    (staging / ".complete").touch()
    shutil.rmtree(lib, ignore_errors=True)
    staging.rename(lib)


def classpath() -> str:
    return str(distribution() / "*")


def _archive() -> Path:
    """The class-data archive for this JVM (an archive is only valid for the JVM that wrote
    it: keyed by the binary's path, size and time)."""
    binary = Path(java()).resolve()
    stat = binary.stat()
    key = hashlib.sha256(f"{binary}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / f"classes-{key[:16]}.jsa"


def java_command(main: str, *args: str, heap_mb: int = 256, fast: bool = True) -> list[str]:
    """``java`` running ``main`` from Kafka's jars (a tool or the broker)."""
    options = [f"-Xmx{heap_mb}m", "-Xss1m", "-Djava.awt.headless=true"]
    if fast:
        options += ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
        archive = _archive()
        if archive.exists():
            options += [f"-XX:SharedArchiveFile={archive}", "-Xlog:cds=off,cds+dynamic=off"]
    return [java(), *options, "-cp", classpath(), main, *args]


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes in URL-safe base64 without padding. As Kafka's
    ``Uuid.randomUuid``, never one that starts with a dash, which ``kafka-storage format
    --cluster-id`` would read as an option (one id in 64)."""
    while True:
        encoded = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not encoded.startswith("-"):
            return encoded


# ------------------------------------------------------------------------------ the nodes


@dataclass
class KafkaNode:
    """One process of a cluster: a broker and a KRaft controller."""

    node_id: int
    directory: Path
    port: int = field(default_factory=embedded.free_port)
    controller_port: int = field(default_factory=embedded.free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def wait_exit(self, timeout: float) -> None:
        if self.process is None:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout)
        self.process = None

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no broker log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class KafkaCluster:
    """Apache Kafka in KRaft mode on loopback: ``size`` nodes, each broker and controller.

    With one node it stands in for the embedded broker (``bootstrap``, ``start``, ``stop``,
    ``restart``, ``log_tail``, ``process``); with three, internal topics and the default for
    new topics get three replicas and ``min.insync.replicas=2``.
    """

    size: int = 1
    directory: Path | None = None
    fast: bool = True
    heap_mb: int = 384
    overrides: Mapping[str, str] = field(default_factory=dict)
    cluster_id: str = field(default_factory=new_cluster_id)
    nodes: list[KafkaNode] = field(init=False)
    _own_directory: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="kafka-"))
            self._own_directory = True
        self.nodes = [
            KafkaNode(node_id, self.directory / f"node-{node_id}")
            for node_id in range(1, self.size + 1)
        ]

    # -- what clients see

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The first node's process (the only one of a single-node cluster)."""
        return self.nodes[0].process

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    # -- configuration

    def properties(self, node: KafkaNode) -> dict[str, str]:
        replicas = str(min(self.size, 3))
        isr = "2" if self.size >= 3 else "1"
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.data),
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "6",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "6",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": isr,
            # A test's group settles at once, not after three seconds.
            "group.initial.rebalance.delay.ms": "0",
            # The cleaner wakes every half second, so a compacted topic with a small
            # segment.ms is really compacted during a test.
            "log.cleaner.backoff.ms": "500",
            "log.cleaner.threads": "1",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "2",
            "num.recovery.threads.per.data.dir": "1",
            "num.replica.fetchers": "1",
        }
        if self.size > 1:
            # A killed node is fenced (its partitions led elsewhere) within seconds; not
            # quicker, or a node merely starved of CPU on a busy machine is fenced too.
            settings["broker.heartbeat.interval.ms"] = "500"
            settings["broker.session.timeout.ms"] = "6000"
            settings["replica.lag.time.max.ms"] = "6000"
        else:
            # A single node fencing itself (its controller's event queue starved of CPU)
            # takes every partition offline; nothing else would lead them anyway.
            settings["broker.session.timeout.ms"] = "60000"
        if self.size == 1:
            settings["controller.quorum.bootstrap.servers"] = f"127.0.0.1:{node.controller_port}"
        else:
            settings["controller.quorum.voters"] = voters
        settings.update(self.overrides)
        return settings

    def _write_config(self, node: KafkaNode) -> Path:
        node.directory.mkdir(parents=True, exist_ok=True)
        config = node.directory / "server.properties"
        lines = [f"{key}={value}" for key, value in self.properties(node).items()]
        config.write_text("\n".join(lines) + "\n")
        (node.directory / "log4j2.properties").write_text(LOG_CONFIG)
        return config

    def _format(self, node: KafkaNode, config: Path) -> None:
        if (node.data / "meta.properties").exists():
            return
        args = ["format", "--cluster-id", self.cluster_id, "--config", str(config)]
        if self.size == 1:
            args.append("--standalone")
        done = subprocess.run(
            java_command(STORAGE_TOOL, *args, heap_mb=128),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise embedded.BrokerError(
                f"could not format node {node.node_id}: {(done.stdout + done.stderr)[-2000:]}"
            )

    # -- processes

    def _launch(self, node: KafkaNode) -> None:
        config = self._write_config(node)
        self._format(node, config)
        command = java_command(BROKER_MAIN, str(config), heap_mb=self.heap_mb, fast=self.fast)
        archive = _archive()
        if self.fast and not archive.exists():
            # This node writes the class-data archive when it stops cleanly (stop_node).
            command.insert(1, f"-XX:ArchiveClassesAtExit={self._archive_draft(node)}")
        command.insert(1, f"-Dlog4j2.configurationFile={node.directory / 'log4j2.properties'}")
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own session: a terminal's Ctrl-C reaches its owner, who stops it in order.
                start_new_session=True,
            )

    def _archive_draft(self, node: KafkaNode) -> Path:
        return node.directory / "classes.jsa"

    def start(self, timeout: float = 120.0) -> None:
        """Starts every node that is not running; returns when all answer metadata."""
        for node in self.nodes:
            if not node.alive():
                self._launch(node)
        self.wait_ready(timeout)

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        self._launch(self.node(node_id))
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until every running node listens and one of them lists every running node."""
        deadline = time.monotonic() + timeout
        running = [node for node in self.nodes if node.alive()]
        try:
            for node in running:
                assert node.process is not None
                embedded._wait_for_port(
                    "127.0.0.1", node.port, max(1.0, deadline - time.monotonic()), node.process
                )
            wanted = {node.node_id for node in running}
            self._wait_brokers(wanted, deadline)
        except embedded.BrokerError as error:
            tails = "\n".join(
                f"--- node {node.node_id} log ---\n{node.log_tail()}" for node in self.nodes
            )
            self.stop()
            raise embedded.BrokerError(f"{error}\n{tails}") from error

    def _wait_brokers(self, wanted: set[int], deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        bootstrap = ",".join(n.bootstrap for n in self.nodes if n.node_id in wanted)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        seen: set[int] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # KafkaException while it connects
                seen = set(admin.list_topics(timeout=2).brokers)
                if wanted <= seen:
                    return
            time.sleep(0.1)
        raise embedded.BrokerError(f"brokers {sorted(wanted)} not all registered: saw {seen}")

    def stop_node(self, node_id: int) -> None:
        """Stops a node cleanly (SIGTERM: a controlled shutdown), else kills it."""
        node = self.node(node_id)
        node.signal(signal.SIGTERM)
        node.wait_exit(STOP_TIMEOUT_S)
        self._keep_archive(node)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL: the node dies as a crashed machine would, without a word to the others."""
        node = self.node(node_id)
        node.signal(signal.SIGKILL)
        node.wait_exit(STOP_TIMEOUT_S)

    def _keep_archive(self, node: KafkaNode) -> None:
        draft = self._archive_draft(node)
        if draft.exists():
            with contextlib.suppress(OSError):
                os.replace(draft, _archive())

    def stop(self) -> None:
        """Stops every node (all at once: a cluster's last nodes would wait on the first)."""
        for node in self.nodes:
            node.signal(signal.SIGTERM)
        for node in self.nodes:
            node.wait_exit(STOP_TIMEOUT_S)
            self._keep_archive(node)

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stops every node and removes the data a temporary directory held (killed at once
        when there are several: their data is thrown away, and a clean stop of a cluster
        waits on its controllers)."""
        if self.size > 1:
            for node in self.nodes:
                node.signal(signal.SIGKILL)
        self.stop()
        if self._own_directory and self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(
            f"--- node {node.node_id} ---\n{node.log_tail(lines)}" for node in self.nodes
        )


# Kafka's answers while a group coordinator is still being elected or loaded.
_NOT_YET = {
    14,  # COORDINATOR_LOAD_IN_PROGRESS
    15,  # COORDINATOR_NOT_AVAILABLE
    16,  # NOT_COORDINATOR
}


def warm_up(bootstrap: str, timeout: float = 60.0) -> None:
    """Has Kafka create its internal topics (group offsets, transaction state) now, so that a
    first commit or transaction does not wait on their creation."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, not in __all__
        AdminClient,
        NewTopic,
    )

    # Quiet clients: not the expected "coordinator load in progress" while topics are created.
    quiet: dict[str, str | int | float | bool] = {"bootstrap.servers": bootstrap, "log_level": 3}
    admin = AdminClient(quiet)
    topic = "__kgo-warm-up"
    with contextlib.suppress(KafkaException):
        admin.create_topics([NewTopic(topic, 1)])[topic].result(timeout)
    producer = Producer({**quiet, "transactional.id": f"kgo-warm-up-{uuid.uuid4().hex}"})
    producer.init_transactions(timeout)
    producer.begin_transaction()
    producer.produce(topic, b"warm-up")
    producer.commit_transaction(timeout)
    consumer = Consumer({**quiet, "group.id": "kgo-warm-up"})
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
                break
            except KafkaException as error:
                # The group coordinator moves or loads while its topic is being created.
                if not error.args[0].retriable() and error.args[0].code() not in _NOT_YET:
                    raise
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
    finally:
        consumer.close()
    admin.delete_consumer_groups(["kgo-warm-up"])["kgo-warm-up"].result(timeout)
    admin.delete_topics([topic])[topic].result(timeout)


@contextlib.contextmanager
def running_kafka(
    size: int = 1,
    *,
    fast: bool = True,
    heap_mb: int = 384,
    overrides: Mapping[str, str] | None = None,
    warm: bool = True,
) -> Iterator[KafkaCluster]:
    """A started Apache Kafka cluster of ``size`` nodes on temporary storage, removed on exit."""
    cluster = KafkaCluster(size, fast=fast, heap_mb=heap_mb, overrides=dict(overrides or {}))
    try:
        cluster.start()
        if warm:
            warm_up(cluster.bootstrap)
        yield cluster
    finally:
        cluster.close()
