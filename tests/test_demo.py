"""The demo's own checks and plumbing, without running the demo (it takes minutes).

The whole ``kgo demo`` runs two Spark jobs with their JVM starts, too slow for the suite; these
tests cover what decides whether it reports success: the table it prints, the reading of the
members' journals that shows where they resumed, the failure of a Spark job, and stopping a
job together with everything it started.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_group_operator.commands import demo
from kafka_group_operator.embedded import broker as embedded
from tests.protocol import test_gateway_readme


def write_journal(
    path: Path, events: list[tuple[int, int, float]], torn_tail: bool = False
) -> None:
    """Lines as a member process writes them: one per processed message."""
    with path.open("a") as journal:
        journal.write(json.dumps({"e": "start", "member": "m", "t": 0.0}) + "\n")
        for partition, offset, at in events:
            message = {"e": "m", "tp": ["orders", partition], "o": offset, "t": at}
            journal.write(json.dumps(message) + "\n")
        if torn_tail:  # a kill -9 in the middle of a line
            journal.write('{"e": "m", "tp": ["orders", 0')


def test_offsets_table_aligns_columns_and_marks_missing_partitions() -> None:
    lines = demo.offsets_table(
        "orders",
        [
            ("snapshot", {("orders", 0): 5, ("orders", 1): 12345, ("other", 0): 9}),
            ("after restore", {("orders", 0): 5}),
        ],
    )
    assert lines == [
        "  orders partition      0     1",
        "  snapshot              5 12345",
        "  after restore         5     -",
    ]


def test_first_processed_takes_the_earliest_message_after_the_restart(tmp_path: Path) -> None:
    group = demo.LocalGroup(directory=tmp_path)
    since = 100.0
    # orders-0 held partition 0 before the restart (offsets 40-41), then resumed it at 7;
    # partition 1 moved from orders-1 (first at 8, t=101) to orders-0 (t=105).
    write_journal(group.journal_path("orders-0"), [(0, 40, 90.0), (0, 41, 99.9)])
    write_journal(group.journal_path("orders-0"), [(0, 7, 100.5), (0, 8, 100.6), (1, 20, 105.0)])
    write_journal(group.journal_path("orders-1"), [(1, 8, 101.0), (1, 9, 101.1)], torn_tail=True)
    assert demo.first_processed(group, ["orders-0", "orders-1"], since) == {
        ("orders", 0): 7,
        ("orders", 1): 8,
    }
    assert demo.first_processed(group, ["orders-1"], 200.0) == {}


def test_a_failed_job_stops_the_demo_with_its_reason(tmp_path: Path) -> None:
    out = io.StringIO()
    screen = demo.Screen(demo.LocalGroup(directory=tmp_path), out)
    # No --group: the job's argument parser refuses before any Spark starts.
    with pytest.raises(demo.DemoFailed, match=r"the snapshot job failed: .*--group"):
        demo.run_job(screen, "snapshot", ["--bootstrap", "127.0.0.1:9"], "snapshot")
    assert "required" in (tmp_path / "snapshot.log").read_text()


def test_stopping_a_job_stops_what_it_started(tmp_path: Path) -> None:
    # A job that starts a child of its own (as a Spark job starts its JVM), in its own session.
    child_pid = tmp_path / "child.pid"
    process = subprocess.Popen(
        ["sh", "-c", f"sleep 300 & echo $! > {child_pid}; wait"], start_new_session=True
    )
    deadline = time.monotonic() + 10
    while not child_pid.exists() or not child_pid.read_text().strip():
        assert time.monotonic() < deadline, "the job never started its child"
        time.sleep(0.05)
    child = int(child_pid.read_text())
    demo.stop_process_group(process)
    assert process.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


@pytest.mark.broker
def test_a_piped_demo_counts_the_leavers_moves_shows_restarts_and_prints_only_changes(
    broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    group = demo.LocalGroup(
        group=f"demo-{tmp_path.name[-8:]}",
        topic=f"orders-{tmp_path.name[-8:]}",
        partitions=4,
        state_partitions=1,
        directory=tmp_path,
    )
    group.start(broker)
    try:
        out = io.StringIO()  # not a terminal
        screen = demo.Screen(group, out)
        for instance in ("orders-0", "orders-1"):
            group.start_member(instance)
        group.wait_settled({"orders-0", "orders-1"}, timeout=60)
        leaver = group.ownership()["orders-1"]

        # The scale-down: who owned what is taken before the leaver goes.
        before = demo._owners(group)
        group.stop_members(["orders-1"], permanent=True)
        assert screen.watch(
            "scaled down", 60, until=lambda: group.settled({"orders-0"}), before=before
        )
        frames = out.getvalue().split("\nkgo demo  ")[1:]
        moved = ", ".join(f"{t}[{p}] orders-1->orders-0" for t, p in sorted(leaver))
        assert frames[-1].endswith(f"\npartitions moved in this step: {len(leaver)}  ({moved})\n")

        # Unchanged frames are not written again.
        written = out.getvalue()
        screen.show("scaled down", before)
        screen.show("scaled down", before)
        assert out.getvalue() == written

        # kill -9 and a restart in the same pod: the new process is shown.
        killed = group.members["orders-0"].pid
        group.kill_member("orders-0")
        restarted = group.start_member("orders-0", same_pod=True).pid
        assert restarted != killed
        assert screen.processes() == f"orders-0 pid {restarted} (restarted 1x)"
        screen.show("restarted", demo._owners(group))
        assert f"member processes: orders-0 pid {restarted} (restarted 1x)\n" in out.getvalue()
    finally:
        group.stop()


@pytest.mark.broker
def test_an_unmodified_kafka_client_joins_through_the_gateway_owns_and_commits(
    broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    """The demo's plain confluent-kafka consumer (no import of ours) joins the group beside a
    library member through ``kgo gateway``: it owns partitions, its commits reach the
    coordinator, and the frame lists its process."""
    group = demo.LocalGroup(
        group=f"demo-{tmp_path.name[-8:]}",
        topic=f"orders-{tmp_path.name[-8:]}",
        partitions=4,
        state_partitions=1,
        directory=tmp_path,
        kafka_listener=True,
        mirror_interval_s=1,
        metrics=True,
    )
    # The client is the README's example, which imports nothing of ours (tested there).
    assert test_gateway_readme.readme_consumer() == demo.KAFKA_CLIENT
    group.start(broker)
    producer = demo.Producer(broker.bootstrap, group.topic, group.partitions, rate=100)
    try:
        producer.start()
        group.start_member("orders-0")
        group.wait_settled({"orders-0"}, timeout=60)
        out = io.StringIO()
        # Raises DemoFailed unless the client comes to own partitions and the coordinator
        # sees its commits of them move past the first one seen.
        demo.kafka_client_joins(demo.Screen(group, out), "orders-kafka", 0)
        owned = group.ownership()["orders-kafka"]
        assert owned
        assert group.ownership()["orders-0"].isdisjoint(owned)
        pid = group.kafka_clients["orders-kafka"].pid
        assert f"orders-kafka pid {pid} (confluent-kafka via kgo gateway)" in out.getvalue()
        assert "orders-kafka (confluent-kafka, importing nothing of kgo" in out.getvalue()
        # Stopped as a pod is (SIGTERM): the client leaves; the library member takes all.
        group.stop_kafka_clients()
        group.wait_settled({"orders-0"}, timeout=60)

        # The demo's end: the producer stops, the members catch up, and the brokers' own group
        # comes to carry the coordinator's offsets (raises DemoFailed otherwise).
        out = io.StringIO()
        demo.mirror_and_metrics(demo.Screen(group, out), producer)
        with contextlib.closing(group.client()) as coordinator:
            ours = coordinator.fetch()
        ends = {(group.topic, p): end for p, end in producer.produced.items()}
        assert ours == ends  # every message committed, both members' commits among them
        # Read here on its own, with a consumer of the group that never joins (OffsetFetch).
        native = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group.group})
        try:
            answered = native.committed(
                [TopicPartition(group.topic, p) for p in range(group.partitions)], timeout=10
            )
        finally:
            native.close()
        theirs = {(tp.topic, tp.partition): tp.offset for tp in answered}
        assert theirs == ours
        text = out.getvalue()
        assert f"the brokers' own group {group.group} " in text
        table = demo.offsets_table(
            group.topic, [("coordinator", ours), ("brokers' group", theirs), ("log end", ends)]
        )
        assert "\n".join(table) + "\n" in text
        # The /metrics lines: kafka-lag-exporter's series of partition 0 and of the group,
        # the mirror's, and the coordinator's counters, scraped from the running process.
        printed = text.split("/metrics (kafka-lag-exporter's names and labels)")[1].splitlines()
        series = {line.strip().split("{")[0].split(" ")[0] for line in printed[1:]}
        assert {
            "kafka_consumergroup_group_offset",
            "kafka_consumergroup_group_lag",
            "kafka_consumergroup_group_max_lag",
            "kafka_consumergroup_group_sum_lag",
            "kgo_offsets_mirrored",
            "kgo_heartbeats_total",
            "kgo_offset_commits_total",
        } <= series
        offset_line = next(
            line for line in printed if line.strip().startswith("kafka_consumergroup_group_offset{")
        )
        assert 'partition="0"' in offset_line
        assert f'group="{group.group}"' in offset_line
        assert float(offset_line.rsplit(" ", 1)[1]) == ours[(group.topic, 0)]
        mirrored = next(
            line for line in printed if line.strip().startswith("kgo_offsets_mirrored{")
        )
        assert 'reason="CaughtUp"' in mirrored
        assert mirrored.endswith(" 1.0")
        # Partitions 1 to 3 left out: at least their offsets (their lag once its log end is read).
        left_out = re.fullmatch(
            r"  \.\.\. and (\d+) more lines of the other partitions", printed[-1]
        )
        assert left_out is not None
        assert int(left_out.group(1)) >= 3
    finally:
        producer.stop()
        group.stop()


def test_a_frame_fits_the_terminal_with_its_header_on_top() -> None:
    head = "kgo demo  12:00:00  " + "a caption long enough to need a second line " * 3
    body = ["group demo.orders  state Stable  " + "x" * 120, "INSTANCE  EPOCH", "orders-0  1"]
    notes = [f"note {index} " + "y" * (index * 7) for index in range(40)]
    lines = demo.fit(head, body, notes, columns=80, rows=24)
    assert len(lines) <= 23  # the last row keeps the cursor: nothing scrolls
    assert all(len(line) <= 79 for line in lines)  # nothing wraps
    assert lines[0].startswith("kgo demo  12:00:00  a caption")
    assert lines[1].startswith("  ")  # the caption's second line
    assert lines[2] == ""
    assert lines[3].endswith("…")
    assert lines[-1].startswith("note 39 ")  # the latest notes, the older ones dropped
    # A terminal too small for the body still gets the header, and no more rows than it has.
    small = demo.fit(head, body * 10, notes, columns=80, rows=8)
    assert len(small) == 7
    assert small[0].startswith("kgo demo")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.broker
def test_on_an_80_by_24_terminal_every_frame_fits_and_the_last_sections_show(
    broker: embedded.EmbeddedBroker, tmp_path: Path
) -> None:
    group = demo.LocalGroup(
        group=f"demo-{tmp_path.name[-8:]}",
        topic=f"orders-{tmp_path.name[-8:]}",
        partitions=12,
        state_partitions=1,
        directory=tmp_path,
    )
    group.start(broker)
    try:
        out = Terminal()
        screen = demo.Screen(group, out, size=(80, 24))
        for index in range(6):
            group.start_member(f"orders-{index}")
        caption = "orders-1 crashed (kill -9) and restarted in its pod: nothing moves " * 2
        screen.watch(caption, 30, until=lambda: len(group.ownership()) == 6)
        screen.note("", "snapshot written to file:///tmp/x", *[f"  line {i}" for i in range(12)])
        screen.show(caption, demo._owners(group))
        last = len(screen.notes)
        screen.note(
            "",
            "the brokers' own group carries the coordinator's offsets:",
            *demo.offsets_table(
                group.topic,
                [
                    (label, {(group.topic, p): 6568 for p in range(12)})
                    for label in ("coordinator", "brokers' group", "log end")
                ],
            ),
        )
        screen.note(
            "",
            "http://127.0.0.1:1/metrics (kafka-lag-exporter's names and labels), the lines:",
            *[
                f'  kafka_consumergroup_group_lag{{client_id="orders-0",p="{i}"}} 0.0'
                for i in range(9)
            ],
            "  ... and 33 more lines of the other partitions",
        )
        screen.finish("the brokers' own group and the coordinator's /metrics", last)
    finally:
        group.stop()
    frames = out.getvalue().split("\x1b[2J\x1b[H")[1:]
    assert frames
    for frame in frames:
        lines = frame.split("\n")[:-1]
        assert len(lines) <= 23, frame
        assert all(len(line) <= 79 for line in lines), frame
        assert lines[0].startswith("kgo demo  "), frame
    final = frames[-1].split("\n")
    assert "the brokers' own group carries the coordinator's offsets:" in final
    assert "  ... and 33 more lines of the other partitions" in final
    assert final[0].endswith("the brokers' own group and the coordinator's /metrics")
    assert final[1] == ""  # one blank line between the header and the notes


def test_a_metrics_line_keeps_its_value_and_its_partitions_labels_on_a_terminal() -> None:
    assert (
        demo.short_series(
            'kafka_consumergroup_group_lag{client_id="orders-0",cluster_name="default",'
            'consumer_id="3f",group="demo.orders",member_host="127.0.0.1",partition="0",'
            'topic="orders"} 12.0'
        )
        == 'kafka_consumergroup_group_lag{partition="0",topic="orders"} 12.0'
    )
    assert demo.short_series("kgo_heartbeats_total 3916.0") == "kgo_heartbeats_total 3916.0"
