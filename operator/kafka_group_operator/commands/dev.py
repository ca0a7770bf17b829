"""``kgo dev up|down|env``: a local broker and coordinator that outlive the command.

``up`` starts the embedded broker and a standalone coordinator as background processes (in
their own sessions, so they survive the shell that started them), creates a topic with some
messages and a group with its token, and prints the environment a member needs as ``export``
lines on stdout (``eval "$(kgo dev up)"``); what it started goes to stderr. Its state
(``dev.json``, ``tokens.json``, ``groups.json``, the logs) lives in ``$KGO_DEV_DIR``, else
``~/.kgo-dev``. ``down`` stops both; ``env`` prints the exports again. ``up`` while up and
``down`` while down say so and succeed; ``up`` while up with another ``--group``, ``--topic``,
``--partitions`` or ``--messages`` than the running setup's is refused, naming what runs. The
broker keeps its data in memory: ``down`` forgets the topic, the offsets and the group.

``dev.json`` is written as each process starts, so ``down`` stops whatever an ``up`` that was
killed had started; an ``up`` interrupted by Ctrl-C stops what it started itself and ends in
one line (exit code 130).

The broker is the embedded one (tansu, no Java needed) unless ``--broker kafka`` asks for Apache
Kafka (one KRaft node, its jars fetched once per machine with Maven; its log folder is
``$KGO_DEV_DIR/kafka``, formatted anew at each ``up``).

The group is started as the demo starts its own (``demo.LocalGroup``), one code path for both.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kafka_group_operator.commands import common

STATE_FILE = "dev.json"
STOP_TIMEOUT_S = 15.0
# What ``up`` creates unless told otherwise.
DEFAULTS: dict[str, Any] = {
    "group": "shop.orders",
    "topic": "orders",
    "partitions": 6,
    "messages": 1000,
}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "dev", help="start/stop a local broker and coordinator with a topic and a group"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start them; print the member environment")
    # No argparse defaults: an option given while a setup is up must match it (see run_up).
    up.add_argument("--group", help=f"the group id (default {DEFAULTS['group']})")
    up.add_argument("--topic", help=f"the topic to create (default {DEFAULTS['topic']})")
    up.add_argument(
        "--partitions", type=int, help=f"its partitions (default {DEFAULTS['partitions']})"
    )
    up.add_argument(
        "--messages",
        type=int,
        help=f"messages to produce into it (default {DEFAULTS['messages']})",
    )
    up.add_argument(
        "--broker",
        choices=sorted(BROKERS),
        help="the broker: tansu (embedded, the default) or kafka (Apache Kafka, needs Java)",
    )
    up.set_defaults(func=run_up)
    down = actions.add_parser("down", help="stop the broker and the coordinator")
    down.set_defaults(func=run_down)
    env = actions.add_parser("env", help="print the member environment again")
    env.set_defaults(func=run_env)


def directory() -> Path:
    return Path(os.environ.get("KGO_DEV_DIR") or Path.home() / ".kgo-dev")


def note(message: str) -> None:
    print(f"kgo dev: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------- processes


def running(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and still the process we started (its command holds
    ``marker``), so that a recycled pid is never signalled."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but someone else's: not ours
        return False
    cmdline = Path(f"/proc/{pid}/cmdline")
    if not cmdline.parent.parent.joinpath("self").exists():
        return True  # no /proc (macOS): trust the pid
    try:
        # A zombie's command line is empty: it is no longer running.
        return marker.encode() in cmdline.read_bytes()
    except OSError:
        return False


def stop(pid: int, marker: str) -> None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``, until the process is gone."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        if not running(pid, marker):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while time.monotonic() < deadline and running(pid, marker):
            time.sleep(0.05)


# The parts of a setup and what their command lines hold (the broker's, by kind of broker).
PARTS = {"coordinator": "kafka_group_operator", "broker": "tansu"}
BROKERS = {"tansu": "tansu", "kafka": "kafka.Kafka"}


def markers(state: dict[str, Any]) -> dict[str, str]:
    """What each part's command line holds; a state written before ``--broker`` is tansu's."""
    return {**PARTS, "broker": BROKERS[state.get("broker", {}).get("kind", "tansu")]}


def read_state() -> dict[str, Any] | None:
    path = directory() / STATE_FILE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise common.CommandError(f"cannot read {path}: {error}; remove it to start over") from None
    return state


def alive(state: dict[str, Any]) -> dict[str, bool]:
    """Each part's liveness; a part the state has no pid for (an ``up`` cut short) is down."""
    return {
        part: part in state and running(state[part]["pid"], marker)
        for part, marker in markers(state).items()
    }


def exports(state: dict[str, Any]) -> str:
    variables = {
        "KAFKA_BOOTSTRAP_SERVERS": state["broker"]["bootstrap"],
        "KGO_COORDINATOR_URL": state["coordinator"]["url"],
        "KGO_GROUP_ID": state["group"],
        "KGO_GROUP_TOKEN": state["token"],
        "KGO_TOPICS": state["topic"],
        "KGO_AUTO_OFFSET_RESET": "earliest",
    }
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in variables.items())


def stop_all(state: dict[str, Any]) -> None:
    # The coordinator first: it writes to the broker until it stops.
    for part, marker in markers(state).items():
        if part in state:
            stop(state[part]["pid"], marker)


def write_state(state: dict[str, Any]) -> None:
    (directory() / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")


# -------------------------------------------------------------------------------- commands


def run_up(args: argparse.Namespace) -> int:
    asked = {name: getattr(args, name) for name in DEFAULTS if getattr(args, name) is not None}
    wanted = {**DEFAULTS, **asked}
    for name in ("group", "topic"):
        if not wanted[name]:
            raise common.UsageError(f"--{name} must not be empty")
    if wanted["partitions"] < 1 or wanted["messages"] < 0:
        raise common.UsageError("--partitions must be >= 1 and --messages >= 0")
    state = read_state()
    if state is not None:
        status = alive(state)
        if all(status.values()):
            running_setup = {name: state.get(name) for name in DEFAULTS}
            running_setup["broker"] = state["broker"].get("kind", "tansu")
            if args.broker is not None:
                asked["broker"] = args.broker
            differ = {name: value for name, value in asked.items() if running_setup[name] != value}
            if differ:
                given = ", ".join(f"--{name} {value}" for name, value in differ.items())
                now = ", ".join(f"{name} {running_setup[name]}" for name in differ)
                raise common.CommandError(
                    f"already up with {now}, not {given}: 'kgo dev down' first to start "
                    "another setup"
                )
            note(
                f"already up: broker {state['broker']['bootstrap']}, coordinator "
                f"{state['coordinator']['url']}, group {state['group']} ('kgo dev down' stops them)"
            )
            sys.stdout.write(exports(state))
            return 0
        gone = ", ".join(part for part, up in status.items() if not up)
        note(f"the last setup is half down ({gone} not running); starting again")
        stop_all(state)
        (directory() / STATE_FILE).unlink(missing_ok=True)
    state = start(argparse.Namespace(**wanted, broker=args.broker or "tansu"))
    sys.stdout.write(exports(state))
    return 0


def start(args: argparse.Namespace) -> dict[str, Any]:
    # The demo's harness and the broker module load the Kafka client: imported when used.
    from kafka_group_operator.commands import demo
    from kafka_group_operator.embedded import broker as embedded
    from kafka_group_operator.embedded import kafka

    home = directory()
    home.mkdir(parents=True, exist_ok=True)
    broker: embedded.EmbeddedBroker | kafka.KafkaCluster
    if args.broker == "kafka":
        # Formatted anew: the last setup's log folder belongs to a cluster that is gone.
        shutil.rmtree(home / "kafka", ignore_errors=True)
        broker = kafka.KafkaCluster(directory=home / "kafka")
    else:
        broker = embedded.EmbeddedBroker(log_path=home / "broker.log")
    local = demo.LocalGroup(
        group=args.group,
        topic=args.topic,
        partitions=args.partitions,
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
        directory=home,
        keep_directory=True,
        # The default state topic, so that the jobs (`kgo snapshot`) need no --state-topic.
        state_topic_name=common.DEFAULT_STATE_TOPIC,
    )
    state: dict[str, Any] = {
        "group": args.group,
        "topic": args.topic,
        "partitions": args.partitions,
        "messages": args.messages,
        "token": local.token,
    }
    interrupted: list[int] = []

    def on_sigint(signum: int, frame: object) -> None:
        # Remembered as well as raised: a KeyboardInterrupt raised while a C extension (the
        # Kafka client) is on the stack can surface as a SystemError instead.
        interrupted.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        broker.start()
        assert broker.process is not None
        # Recorded at once: `kgo dev down` stops it even if this command is killed now.
        state["broker"] = {
            "pid": broker.process.pid,
            "bootstrap": broker.bootstrap,
            "kind": args.broker,
        }
        write_state(state)
        if isinstance(broker, kafka.KafkaCluster):
            kafka.warm_up(broker.bootstrap)
        local.broker = broker
        local.create_topic(args.topic, args.partitions)
        produce(broker.bootstrap, args.topic, args.partitions, args.messages)
        local.start_coordinator()
    except BaseException as error:
        # Nothing half-started stays behind (Ctrl-C included); the logs do, for the reason.
        # The frames cut short hold Kafka clients: released first, so that none of them is
        # left to log the broker's going away.
        error.__traceback__ = None
        gc.collect()
        if local.coordinator is not None:
            local.coordinator.kill()
            local.coordinator.wait()
        broker.stop()
        (home / STATE_FILE).unlink(missing_ok=True)
        if interrupted or isinstance(error, KeyboardInterrupt):
            raise Interrupted("interrupted: stopped what had started") from None
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise common.CommandError(f"could not start: {first} (logs in {home})") from None
    finally:
        signal.signal(signal.SIGINT, previous)
    assert local.coordinator is not None
    state["coordinator"] = {"pid": local.coordinator.pid, "url": local.coordinator_url}
    write_state(state)
    name = "Apache Kafka broker" if args.broker == "kafka" else "broker"
    note(f"{name} on {broker.bootstrap}, coordinator on {local.coordinator_url} (logs in {home})")
    note(
        f"topic {args.topic} ({args.partitions} partitions, {args.messages} messages), "
        f"group {args.group} (token in {home / 'tokens.json'})"
    )
    note('a member needs this environment; eval "$(kgo dev env)" sets it in another shell')
    return state


class Interrupted(common.CommandError):
    code = 130


def produce(bootstrap: str, topic: str, partitions: int, count: int) -> None:
    """``count`` messages round-robin over the partitions, durably."""
    from confluent_kafka import Producer

    # One message per batch: the embedded broker reports a wrong log end after batches.
    # librdkafka logs nothing of its own: a failure is the one line below, and an `up`
    # interrupted while producing stops the broker under it without a word from the client.
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "batch.num.messages": 1,
            "log_level": 0,
        }
    )
    for sequence in range(count):
        producer.produce(topic, f"message {sequence}".encode(), partition=sequence % partitions)
        producer.poll(0)
    if producer.flush(30):
        raise common.CommandError(f"could not produce {count} messages to {topic}")


def run_down(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None:
        note(f"nothing to stop (no {directory() / STATE_FILE})")
        return 0
    stop_all(state)
    (directory() / STATE_FILE).unlink(missing_ok=True)
    stopped = [f"the {part} (pid {state[part]['pid']})" for part in PARTS if part in state]
    note(f"stopped {' and '.join(stopped) or 'nothing'}")
    return 0


def run_env(args: argparse.Namespace) -> int:
    state = read_state()
    if state is None or not all(alive(state).values()):
        raise common.CommandError("not up: run 'kgo dev up'")
    sys.stdout.write(exports(state))
    return 0
