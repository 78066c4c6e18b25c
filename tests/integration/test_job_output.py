"""`kafka-scheduler run`'s output is the scheduler's own: a real job against the test broker, started, warmed up
(its Python workers run and print their banners), delivering a few schedules and stopped, prints nothing but its
own log lines. What the engines print still shows when it is an error: the JVM's own standard error, which it
inherited from the job, carries one while the job runs. The same job's processes: Spark's JVM and its Python workers
run at a lower CPU priority than the driver (engine/spark/cpu_priority.py)."""

from __future__ import annotations

import os
import re
import time

from kafka_scheduler.client import SchedulerClient
from kafka_scheduler.config import Config
from kafka_scheduler.engine.spark.cpu_priority import threads_of
from kafka_scheduler.harness import process_tree

# One of our log records: setup_logging's "%(asctime)s %(levelname)-5s %(message)s" (INFO with two spaces).
OUR_LINE = re.compile(r"^\d\d:\d\d:\d\d (INFO  |WARNING )\S")


def nice_values(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, thread) for thread in threads_of(pid)}


def assert_the_engine_yields_to_the_driver(driver: int, jvm: int) -> None:
    """Every thread of the JVM and of its Python workers (which ran the deliveries' batches) at the default
    --engine-niceness, the driver's at its own."""
    own = os.getpriority(os.PRIO_PROCESS, 0)  # the test's, which the driver inherits
    # Live ones: spark-submit's script leaves the JVM a child that ended before the JVM was set (a zombie).
    below = [pid for pid in process_tree.descendants(jvm) if pid != jvm]
    workers = [pid for pid in below if process_tree.state_of(pid) not in (None, "Z", "X")]
    assert workers, "the Python workers, under the JVM"
    assert nice_values(driver) == {own}
    for pid in (jvm, *workers):
        assert nice_values(pid) == {max(own, Config.engine_niceness)}, process_tree.command_line(pid)


def test_the_job_prints_its_own_lines_and_the_engines_errors(kafka, scheduler_factory):
    env = {name: value for name, value in os.environ.items() if name != "KAFKA_SCHEDULER_LOG_LEVEL"}
    scheduler = scheduler_factory(env=env).start().warm_up()
    topic = kafka.topic()
    reader = kafka.reader(topic)
    with SchedulerClient(kafka.bootstrap, app_id=scheduler.app_id) as client:
        for i in range(3):
            client.schedule(topic, "+2s", value=f"v-{i}", request_id=f"r-{i}")
    reader.wait_for(lambda r: True, count=3, what="the deliveries", timeout=120, guard=scheduler.assert_running)

    # The engine's error and a warning, printed where the JVM prints: onto the standard error it inherited.
    jvm = process_tree.spark_jvm(scheduler.process.pid)
    assert_the_engine_yields_to_the_driver(scheduler.process.pid, jvm)
    now = time.strftime("%H:%M:%S")
    engine_error = [f"{now} ERROR Executor: an engine's error, shown", "\tat org.apache.spark.Foo.bar(Foo.scala:1)"]
    with open(f"/proc/{jvm}/fd/2", "w") as jvm_stderr:
        jvm_stderr.write(f"{now} WARN StateStoreProvider: an engine's warning, left out\n")
        jvm_stderr.write("\n".join(engine_error) + "\n")
    scheduler.wait_for_line(engine_error[-1], 30, "the engine's error in the job's output")
    assert scheduler.stop() == 0

    lines = scheduler.log().splitlines()
    assert [line for line in lines if not OUR_LINE.match(line)] == engine_error, scheduler.log()
    assert any("first batch done" in line for line in lines) and "stopped after" in lines[-1], scheduler.log()
    [topics] = [line for line in lines if " INFO  topics: " in line]
    for suffix in ("-schedule-requests", "-schedule-rejections", "-schedule-history", "-scheduler-ticks"):
        assert scheduler.app_id + suffix in topics.split("(")[0], topics
