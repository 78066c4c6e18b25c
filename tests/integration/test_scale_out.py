"""Scale-out: the job on a Spark standalone cluster started on loopback (a master and two workers, each its own
JVM; one executor JVM per worker), reading a requests topic of 4 partitions with 4 shuffle partitions, so the
micro-batches' tasks and the state store's shards are spread over two executor processes.

The executors run the venv's interpreter for their Python workers (the driver passes it on), which has the
package installed, so `--master spark://...` needs no zip here; on machines without the package, `kafka-scheduler
submit` ships it with spark-submit's --py-files (test_submit.py). The checkpoint is a local path,
which every executor reaches because they share this machine; on several machines it must be a shared filesystem.
"""

from __future__ import annotations

import os
import random
import signal
from collections import defaultdict

import pytest

from kafka_scheduler.kafka.topics import admin_client, ensure_topics
from kafka_scheduler.protocol import DELIVERY_ID

from .spark_cluster import LocalSparkCluster
from .support import at, ms_of, native, wait_until

PARTITIONS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=1, memory="1g") as instance:
        yield instance


@pytest.fixture(scope="module")
def scheduler(cluster, scheduler_factory):
    # The driver runs in the scheduler process on loopback; executors get a small heap (the machine is shared).
    with pytest.MonkeyPatch.context() as env:  # the scheduler process takes its environment at start
        env.setenv("SPARK_LOCAL_IP", "127.0.0.1")
        env.setenv("PYSPARK_SUBMIT_ARGS", "--conf spark.executor.memory=512m pyspark-shell")
        process = scheduler_factory(extra_args=("--master", cluster.master_url, "--partitions", str(PARTITIONS)))
        process.start().warm_up()
    yield process


def destination(kafka) -> str:
    """A destination whose records carry the broker's append time: a delivery before its due time shows."""
    name = f"scale-out-{random.getrandbits(40):010x}"
    ensure_topics(admin_client(kafka.bootstrap), [name], PARTITIONS, config={"message.timestamp.type": "LogAppendTime"})
    return name


def schedule(kafka, app_id: str, to: str, prefix: str, count: int, within_s: float) -> dict[bytes, int]:
    """``count`` schedules due at random instants over the next ``within_s`` seconds, keys spread over the
    requests topic's partitions; returns the due time (ms) of each key."""
    due: dict[bytes, int] = {}
    records = []
    for i in range(count):
        key = f"{prefix}-{i}".encode()
        instant = at(random.uniform(0.5, within_s))
        due[key] = ms_of(instant)
        records.append({"key": key, "value": key, "headers": native(to, instant, key.decode())})
    placed = kafka.produce_many(f"{app_id}-schedule-requests", records)
    assert len({partition for partition, _ in placed}) == PARTITIONS
    return due


def wait_for_all(reader, due: dict[bytes, int], scheduler, timeout: float) -> list:
    """Every record read once each scheduled key has at least one delivery (duplicates do not count twice)."""

    def all_delivered():
        return set(due) <= {r.key for r in reader.poll()}

    try:
        wait_until(
            all_delivered, timeout, f"a delivery of each of {len(due)} schedules", guard=scheduler.assert_running
        )
    except TimeoutError as error:
        lost = sorted(set(due) - {r.key for r in reader.records})
        raise AssertionError(f"{error}; {len(lost)} not delivered, e.g. {lost[:5]}") from None
    return reader.read_to_end()


def check(records, due: dict[bytes, int]) -> tuple[dict, list]:
    """Deliveries grouped by key, and the violations: unknown keys, early ones, missing or mixed delivery ids."""
    by_key: dict[bytes, list] = defaultdict(list)
    problems = []
    for record in records:
        if record.key not in due:
            problems.append(("unknown", record.key))
            continue
        by_key[record.key].append(record)
        if record.timestamp_ms < due[record.key]:
            problems.append(("early", record.key, due[record.key] - record.timestamp_ms))
    for key, copies in by_key.items():
        ids = {tuple(r.header_values(DELIVERY_ID)) for r in copies}
        if len(ids) != 1 or len(next(iter(ids))) != 1:
            problems.append(("delivery ids", key, ids))
    return by_key, problems


def test_each_schedule_is_delivered_once_across_two_executor_processes(kafka, cluster, scheduler):
    assert len(cluster.executors()) == 2, cluster.executors()
    [app] = cluster.state()["activeapps"]
    assert app["cores"] == 2, app  # one executor on each worker
    to = destination(kafka)
    reader = kafka.reader(to)
    due = schedule(kafka, scheduler.app_id, to, "once", 600, within_s=30)
    by_key, problems = check(wait_for_all(reader, due, scheduler, timeout=240), due)
    assert not problems, problems[:10]
    assert set(by_key) == set(due)
    duplicated = {k: len(v) for k, v in by_key.items() if len(v) != 1}
    assert not duplicated, duplicated


def test_nothing_is_lost_or_early_when_an_executor_is_killed(kafka, cluster, scheduler):
    """SIGKILL of one executor JVM while schedules are pending and more arrive.

    What an executor loss can cause: the tasks it was running fail, and Spark re-runs them (on the surviving
    executor, or on the replacement the worker starts); the re-run micro-batch reads the same offsets and loads
    the state store from the checkpoint, so nothing is lost. Deliveries the lost task already wrote are written
    again, as duplicates with the same x-scheduler-delivery-id (at-least-once; --exactly-once fences them).
    Deliveries prepared ahead of their due time are held by the timed writer in the driver, not on an
    executor, so they survive the loss and are still written at their due instant.
    """
    to = destination(kafka)
    reader = kafka.reader(to)
    due = schedule(kafka, scheduler.app_id, to, "before", 300, within_s=30)
    reader.wait_for(lambda r: True, count=30, timeout=120, what="the first deliveries", guard=scheduler.assert_running)
    [victim, survivor] = executors = cluster.executors()
    assert len(executors) == 2, executors
    os.kill(victim, signal.SIGKILL)
    mark = len(scheduler.log())
    due.update(schedule(kafka, scheduler.app_id, to, "during", 150, within_s=20))
    wait_until(
        lambda: victim not in cluster.executors() and len(cluster.executors()) == 2,
        180,
        "the worker to start a replacement executor",
        guard=scheduler.assert_running,
    )
    due.update(schedule(kafka, scheduler.app_id, to, "after", 150, within_s=15))
    by_key, problems = check(wait_for_all(reader, due, scheduler, timeout=300), due)
    assert not problems, problems[:10]
    lost = set(due) - set(by_key)
    assert not lost, sorted(lost)[:10]
    assert "Lost executor" in scheduler.log()[mark:], "the driver did not notice the executor's loss"
    duplicates = sum(len(v) - 1 for v in by_key.values())
    print(f"executor {victim} killed ({survivor} survived): {len(due)} schedules, {duplicates} duplicates")
