"""Progress of a long read of the state topic: records read, partitions done out of total.

While a job reads the state topic, a thread of the driver asks Spark's status store which
tasks of the reading stage have finished. Each task reads one offset range
(``source.split_ranges``, in the same order as the stage's task indexes), so finished tasks
give exact counts: the records of the finished ranges, and the state partitions whose ranges
have all finished. A line goes to stderr whenever that changed, looked at every
``interval_s``, and once more when the reading is over: a short job prints one line.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import IO, Any

from pyspark.sql import SparkSession

from kafka_group_jobs import source

INTERVAL_S = 10.0


def progress_line(
    label: str, ranges: list[source.OffsetRange], finished: set[int], total_partitions: int
) -> str:
    """``label: 3/8 partitions done, 375,000/1,000,000 records read``."""
    records = sum(r.end - r.start for index, r in enumerate(ranges) if index in finished)
    total_records = sum(r.end - r.start for r in ranges)
    pending = {r.partition for index, r in enumerate(ranges) if index not in finished}
    return (
        f"{label}: {total_partitions - len(pending)}/{total_partitions} partitions done,"
        f" {records:,}/{total_records:,} records read"
    )


def _finished_tasks(spark: SparkSession, stage_id: int, attempt: int) -> set[int]:
    tasks = spark.sparkContext._jsc.sc().statusStore().taskList(stage_id, attempt, 1 << 30)
    found = set()
    for position in range(tasks.size()):
        task = tasks.apply(position)
        if task.status() == "SUCCESS":
            found.add(int(task.index()))
    return found


@contextlib.contextmanager
def watching(
    spark: SparkSession,
    label: str,
    ranges: list[source.OffsetRange],
    partitions: int,
    interval_s: float | None = None,
    out: IO[str] | None = None,
) -> Iterator[None]:
    """Reports the progress of the Spark actions run inside, while they read ``ranges`` of
    ``partitions`` state partitions (an empty one has no range and is done from the start).

    The actions run in a job group of their own, so the reading stage is found among their
    stages only: the first one with a task per range.
    """
    stream = out if out is not None else sys.stderr
    every = INTERVAL_S if interval_s is None else interval_s
    context = spark.sparkContext
    job_group = f"kgo-progress-{uuid.uuid4().hex}"
    stop = threading.Event()

    def report() -> None:
        stage: tuple[int, int] | None = None
        shown = ""
        while True:
            stopping = stop.wait(every)
            try:
                stage = stage or _reading_stage(spark, job_group, len(ranges))
                if stage is not None:
                    finished = _finished_tasks(spark, *stage)
                    line = progress_line(label, ranges, finished, partitions)
                    if line != shown:
                        stream.write(line + "\n")
                        stream.flush()
                        shown = line
            except Exception:  # a report is never worth failing the job for
                pass
            if stopping:
                return

    previous = context.getLocalProperty("spark.jobGroup.id")
    context.setLocalProperty("spark.jobGroup.id", job_group)
    thread = threading.Thread(target=report, name="kgo-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        context.setLocalProperty("spark.jobGroup.id", previous)  # type: ignore[arg-type]
        stop.set()
        thread.join(10)


def _reading_stage(spark: SparkSession, job_group: str, tasks: int) -> tuple[int, int] | None:
    """The first stage of the group's jobs with one task per range: the one reading the topic."""
    tracker = spark.sparkContext.statusTracker()
    stages: set[int] = set()
    for job_id in tracker.getJobIdsForGroup(job_group):
        job: Any = tracker.getJobInfo(job_id)
        if job is not None:
            stages.update(job.stageIds)
    for stage_id in sorted(stages):
        info: Any = tracker.getStageInfo(stage_id)
        if info is not None and info.numTasks == max(tasks, 1):
            return stage_id, info.currentAttemptId
    return None
