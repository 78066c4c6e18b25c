"""The driver JVM's class archive (--class-archive, engine/spark/class_archive.py) with a real job: a job that starts
without one writes it at its graceful stop, and the next start's JVM maps it and delivers as before."""

from __future__ import annotations

import os
from pathlib import Path

from kafka_scheduler.harness import process_tree
from tests.conftest import TEST_SUBMIT_OPTIONS

from .support import at, native


def _deliver_one(kafka, scheduler, key: bytes) -> None:
    topic = kafka.topic("archived")
    reader = kafka.reader(topic)
    try:
        kafka.produce(f"{scheduler.app_id}-schedule-requests", key=key, headers=native(topic, at(1), key.decode()))
        reader.wait_for(lambda r: r.key == key, timeout=180, what="the delivery", guard=scheduler.assert_running)
    finally:
        reader.close()


def test_a_graceful_stop_writes_the_class_archive_and_the_next_start_maps_it(kafka, scheduler_factory, tmp_path):
    folder = tmp_path / "jvm-archive"
    # The suite's own archive stays out (its SharedArchiveFile would be a second archive for this JVM to dump on).
    env = {**os.environ, "SPARK_SUBMIT_OPTS": TEST_SUBMIT_OPTIONS, "KAFKA_SCHEDULER_CLASS_ARCHIVE": str(folder)}
    scheduler = scheduler_factory(env=env).start()
    _deliver_one(kafka, scheduler, b"before")
    assert scheduler.stop() == 0
    assert "jvm: class archive written" in scheduler.log(), scheduler.log()
    [archive] = folder.iterdir()  # no partial file left beside it
    assert archive.suffix == ".jsa" and archive.stat().st_size > 10 * 2**20

    mark = scheduler.log_size()
    scheduler.start()
    jvm = process_tree.spark_jvm(scheduler.process.pid)
    assert str(archive) in Path(f"/proc/{jvm}/maps").read_text()  # its classes are mapped, not loaded
    _deliver_one(kafka, scheduler, b"after")
    assert scheduler.stop() == 0
    second_run = scheduler.log_since(mark)
    assert f"jvm: starting on the class archive {archive}" in second_run
    assert "writing the class archive" not in second_run
    assert list(folder.iterdir()) == [archive]
