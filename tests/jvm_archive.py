"""A class-data-sharing archive of the Spark driver JVM for the test suite (JDK 17's dynamic AppCDS).

Three quarters of the CPU the suite uses goes to the Spark JVMs of the jobs it starts (some sixty jobs, the unit
tests' session), much of it to load and link the same ~18,000 classes each time. A JVM started on an archive of
them maps the classes instead: measured on this machine (bench/job_start_cpu.py), one job's JVM took 4.4 s of CPU
to a running query instead of 9.1 s, and 15.9 s instead of 23.6 s from start to its first deliveries and a
graceful stop. On 2 workers the suite mostly waits, so its time did not change (29 min 50 s); the CPU saved
matters once more workers share the 2 cores (docs/testing.md).

The archive is written by one job that runs the usual path once (a broker of its own, a few schedules delivered,
SIGTERM): the JVM dumps every class it loaded when it exits (``-XX:ArchiveClassesAtExit``). It is kept in the
checkout's ``.cache`` under a key of what it depends on (the JVM, the Python environment whose Spark jars make the
class path, the connector jars), so a change of any of them builds a new one. A JVM whose class path does not match
the archive runs as without one; its CDS warnings are turned off, so job output stays what users see.
"""

from __future__ import annotations

import fcntl
import os
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from kafka_scheduler.engine.spark import class_archive
from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import JobProcess
from kafka_scheduler.harness.topic_reader import TopicReader
from kafka_scheduler.harness.waiting import wait_until
from kafka_scheduler.kafka.jars import cache_root
from kafka_scheduler.kafka.local_broker import LocalBroker, free_port
from kafka_scheduler.kafka.topics import admin_client, ensure_topics

SCHEDULES = 20  # enough to run a batch that prepares and one that writes deliveries


def archive_path(jvm_options: str) -> Path:
    """Where the archive for this JVM, Python environment, connector jars and JVM options lives (the job's own
    archive is named the same way: engine/spark/class_archive.py)."""
    return class_archive.archive_file(cache_root() / "jvm-archive", jvm_options)


def options(archive: Path) -> str:
    return class_archive.use_options(archive)


def ensure(jvm_options: str, build: bool) -> Path | None:
    """The archive, built first when missing and ``build``; None when there is none (or building failed: the
    suite then runs as it would without, only slower)."""
    archive = archive_path(jvm_options)
    if archive.exists() or not build:
        return archive if archive.exists() else None
    archive.parent.mkdir(parents=True, exist_ok=True)
    with open(archive.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another suite on this checkout may be building it right now
        if archive.exists():
            return archive
        started = time.monotonic()
        try:
            _build(archive, jvm_options)
        except Exception as exc:  # a slower suite, not a failed one
            print(f"\nJVM class archive not built ({exc}); the Spark JVMs load their classes as usual", file=sys.stderr)
            return None
        print(f"\nJVM class archive built in {time.monotonic() - started:.0f}s: {archive}", file=sys.stderr)
    return archive


def _build(archive: Path, jvm_options: str) -> None:
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="jvm-archive-") as work:
        work = Path(work)
        broker = LocalBroker(free_port(), work / "broker")
        broker.start()
        try:
            app_id = f"archive-{uuid.uuid4().hex[:6]}"
            destination = f"{app_id}-out"
            ensure_topics(admin_client(broker.bootstrap_servers), [destination], 1)
            env = {
                **os.environ,
                "SPARK_SUBMIT_OPTS": f"{jvm_options} -XX:ArchiveClassesAtExit={partial}",
                "KAFKA_SCHEDULER_CLASS_ARCHIVE": "off",  # this one, not the job's own
            }
            job = JobProcess(broker.bootstrap_servers, app_id, work / "checkpoint", work / "job.log", env=env)
            job.start()
            jvms = process_tree.pids_of(job.process.pid, "jvm")
            try:
                deliver_a_few(broker.bootstrap_servers, f"{app_id}-schedule-requests", destination, lead_s=2.0)
            finally:
                job.stop()
            # The JVM writes the archive as it exits, which may be after the job's Python process has ended.
            wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in jvms), 120, "the JVM to exit")
        finally:
            broker.stop()
    if not partial.exists() or partial.stat().st_size == 0:
        raise RuntimeError("the job's JVM wrote no archive at its exit")
    os.replace(partial, archive)


def deliver_a_few(bootstrap: str, requests: str, destination: str, lead_s: float) -> None:
    """SCHEDULES native requests due ``lead_s`` from now, to ``destination``; returns once all arrived."""
    from confluent_kafka import Producer

    due = datetime.now(UTC) + timedelta(seconds=lead_s)
    due = due.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    producer = Producer({"bootstrap.servers": bootstrap})
    for i in range(SCHEDULES):
        producer.produce(
            requests,
            key=f"k{i}".encode(),
            value=b"v",
            headers=[
                ("x-scheduler-deliver-to", destination.encode()),
                ("x-scheduler-deliver-at", due.encode()),
                ("x-scheduler-request-id", f"k{i}".encode()),
            ],
        )
    producer.flush(30)
    reader = TopicReader(bootstrap, [destination])
    try:
        reader.wait_for(lambda record: True, count=SCHEDULES, timeout=180, what="deliveries")
    finally:
        reader.close()
