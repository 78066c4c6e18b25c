"""Durable state: stop the scheduler gracefully, restart it on the same checkpoint.

Pending schedules survive; one that fell due while it was down is delivered on restart;
one cancelled before the stop never fires; nothing already delivered is delivered again.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from pathlib import Path

from kafka_scheduler.engine.spark.checkpoint import committed_offsets, last_committed_batch
from kafka_scheduler.harness import process_tree
from kafka_scheduler.harness.job_process import logged_errors

from .support import at, batch_lines, ms_of, native, wait_until


def test_restart_keeps_pending_delivers_what_fell_due_while_down_and_duplicates_nothing(kafka, scheduler_factory):
    scheduler = scheduler_factory().start()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)

    sent_up_to = {}

    def send(key, headers):
        partition, offset = kafka.produce(requests, key=key, value=key, headers=headers, partition=0)
        sent_up_to[partition] = offset + 1

    send(b"before-stop", native(topic, at(1), "r-before"))
    reader.wait_for(lambda r: r.key == b"before-stop", timeout=90, what="delivery before the stop")
    # Due after the stop has surely ended (it lets one more batch run, a few seconds on a loaded machine).
    due_while_down = at(16)
    send(b"due-while-down", native(topic, due_while_down, "r-down"))
    send(b"cancelled", native(topic, at(17), "r-cancel"))
    send(None, native(request_id="r-cancel", action="CANCEL"))
    due_after_restart = at(45)
    send(b"after-restart", native(topic, due_after_restart, "r-after"))
    wait_until(
        lambda: all(
            committed_offsets(scheduler.checkpoint_dir).get(requests, {}).get(p, 0) >= o for p, o in sent_up_to.items()
        ),
        60,
        "the scheduler to commit the requests",
    )

    before_stop = last_committed_batch(scheduler.checkpoint_dir)
    assert scheduler.stop() == 0, scheduler.log()[-2000:]
    assert "stopped after" in scheduler.log()
    # The batch in flight and one more (it retires what the timed writer wrote), even with only ticks to read.
    assert last_committed_batch(scheduler.checkpoint_dir) <= before_stop + 2, "the stop ran batch after batch"
    assert not [r for r in reader.poll() if r.key == b"due-while-down"], "delivered before its due time"
    wait_until(lambda: time.time() * 1000 > ms_of(due_while_down) + 1000, 30, "the due time to pass while down")

    scheduler.start()
    assert "resuming after batch" in scheduler.log()
    reader.wait_for(lambda r: r.key == b"due-while-down", timeout=120, what="the schedule that fell due while down")
    [late] = reader.wait_for(lambda r: r.key == b"after-restart", timeout=120, what="the schedule due after restart")
    assert late.timestamp_ms >= ms_of(due_after_restart)

    keys = Counter(r.key for r in reader.poll())
    assert keys == Counter({b"before-stop": 1, b"due-while-down": 1, b"after-restart": 1}), keys
    delivery_ids = Counter(r.header("x-scheduler-delivery-id") for r in reader.poll())
    assert all(n == 1 for n in delivery_ids.values()), delivery_ids


def test_a_sigterm_to_every_process_of_the_job_stops_it_as_gracefully_as_one_to_the_driver(kafka, scheduler_factory):
    """systemd's default KillMode=control-group, and `kill -- -PGID` for the JVM: the stop reaches Spark's JVM and
    the Python workers at the same moment as the driver. Only the driver acts on it: the batch in flight commits,
    the log says each step in one line, no traceback; after a restart each schedule is delivered once."""
    scheduler = scheduler_factory(own_session=True, extra_args=("--lookahead", "5s")).start().warm_up()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    keys = [f"k{i}".encode() for i in range(60)]
    # Due over the next 12 s, so that at the stop some are written, some held by the timed writer, some pending.
    due = {key: at(1 + i / 5) for i, key in enumerate(keys)}
    kafka.produce_many(
        requests, [dict(key=key, value=key, headers=native(topic, due[key], key.decode()), partition=0) for key in keys]
    )
    reader.wait_for(lambda r: True, count=10, timeout=90, what="the first deliveries", guard=scheduler.assert_running)

    signalled = process_tree.signal_tree(scheduler.process.pid, signal.SIGTERM)
    assert len(signalled) >= 3, f"the driver, the JVM and the Python workers: {signalled}"
    assert scheduler.wait_ended(180) == 0, scheduler.log()[-3000:]
    log = scheduler.log()
    stop = log[log.rindex("\n", 0, log.index("received SIGTERM")) + 1 :]
    # The batch in flight may log its own lines (index, batch) between the two: they come from another thread.
    steps = [
        text
        for text in (line.split("INFO", 1)[-1].strip() for line in stop.splitlines())
        if not text.startswith(("index:", "batch "))
    ]
    assert steps[:2] == ["received SIGTERM", "stopping: waiting for the batch in flight"], stop
    assert "stopped after" in stop and not logged_errors(stop) and "Traceback" not in stop and "ERROR" not in stop, stop

    scheduler.start()
    records = reader.wait_for(
        lambda r: True, count=len(keys), timeout=120, what="every delivery", guard=scheduler.assert_running
    )
    scheduler.mark()  # a later batch has committed: a second copy would be written by now
    records = reader.read_to_end()
    assert Counter(r.key for r in records) == Counter(keys), "each schedule delivered once"
    assert all(r.timestamp_ms >= ms_of(due[r.key]) for r in records), "delivered before its due time"


def test_a_jvm_that_ends_under_the_job_stops_it_with_one_line_and_loses_nothing(kafka, scheduler_factory):
    """Out of heap the JVM exits (session.py: -XX:+ExitOnOutOfMemoryError) instead of leaving a hung query; killed, it
    ends the same way. The driver then exits 1 with one error line and no traceback, and the next start delivers
    what was pending."""
    scheduler = scheduler_factory().start().warm_up()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    due = at(25)
    kafka.produce(requests, key=b"k", value=b"v", headers=native(topic, due, "pending"), partition=0)
    scheduler.mark()
    jvm = process_tree.spark_jvm(scheduler.process.pid)
    # The job's JVM runs with two malloc arenas (engine/spark/session.py) unless the environment says otherwise.
    arenas = os.environ.get("MALLOC_ARENA_MAX", "2").encode()
    assert b"MALLOC_ARENA_MAX=" + arenas in Path(f"/proc/{jvm}/environ").read_bytes().split(b"\0")
    mark = scheduler.log_size()
    process_tree.kill_tree(jvm)
    assert scheduler.wait_ended(60) == 1, scheduler.log()[-3000:]
    ending = scheduler.log_since(mark)
    assert "spark: the JVM ended under the job" in ending and "Nothing is lost" in ending, ending
    assert "Traceback" not in ending and [line for line in ending.splitlines() if "ERROR" in line] == [
        next(line for line in ending.splitlines() if "the JVM ended" in line)
    ], ending

    scheduler.start()
    [record] = reader.wait_for(
        lambda r: r.key == b"k",
        timeout=120,
        what="the pending schedule after the restart",
        guard=scheduler.assert_running,
    )
    assert record.timestamp_ms >= ms_of(due)


def test_an_identical_request_just_before_the_due_time_after_a_restart_keeps_the_earlier_runs_version(
    kafka, scheduler_factory
):
    """A version the first run prepared comes back in the next run only at its due time (its bucket's retire timer).
    An identical ADD read early just before that is the state's no-op: the version keeps its delivery id and goes out
    once, the early one not at all (engine/driver/prepared_horizon.py holds the next run's frontier back)."""
    scheduler = scheduler_factory(extra_args=("--lookahead", "300s")).start()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    due = at(90)  # prepared at once (within the lookahead), and due after the restart even on a loaded machine
    headers = native(topic, due, "same")
    _, first_offset = kafka.produce(requests, key=b"same", value=b"v", headers=headers, partition=0)
    wait_until(
        lambda: any(line.held for line in batch_lines(scheduler.log())), 90, "the version prepared by the first run"
    )
    assert scheduler.stop() == 0, scheduler.log()[-2000:]
    scheduler.start()
    # The destination known to the restarted job, so that the early path takes the request (its first request to a
    # destination waits for a look-up).
    kafka.produce(requests, key=b"other", value=b"v", headers=native(topic, at(1), "other"), partition=0)
    reader.wait_for(lambda r: r.key == b"other", timeout=120, what="another delivery", guard=scheduler.assert_running)
    resend_at = ms_of(due) / 1000 - 0.3
    assert time.time() < resend_at, "the restart took longer than the test allows for"
    wait_until(lambda: time.time() >= resend_at, 120, "just before the due time", interval=0.01)
    kafka.produce(requests, key=b"same", value=b"v", headers=headers, partition=0)
    reader.wait_for(lambda r: r.key == b"same", timeout=60, what="the delivery", guard=scheduler.assert_running)
    wait_until(lambda: time.time() * 1000 > ms_of(due) + 10_000, 30, "a batch cycle or more after the due time")
    delivered = [r.header("x-scheduler-delivery-id").decode() for r in reader.poll(1.0) if r.key == b"same"]
    assert delivered == [f"{requests}-0-{first_offset}"], delivered
