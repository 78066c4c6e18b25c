"""Settings that shape the state are fixed in the checkpoint at its first run.

A restart with another --partitions keeps the recorded shards, so REPLACE and CANCEL still
find the schedules they name; a restart with an explicit other --shards or --state-layout
is refused at once, before Spark starts.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from kafka_scheduler.engine.spark.checkpoint import committed_offsets

from .support import Kafka, at, ms_of, native, wait_until

APP_ID = "state-settings"
REQUESTS = f"{APP_ID}-schedule-requests"
# Spark's xxhash64 of "id:<requests topic>/<id>" puts each of these ids in another shard with 6 shards (the
# default for --partitions 3) than with 4 (--partitions 2): replaced-2 in 0 vs 4, cancelled-1 in 1 vs 3. Shard
# moves are what lose the index entries, so these ids make the test fail on code that lets the shards follow
# --partitions. They depend on APP_ID.
REPLACED, CANCELLED = "replaced-2", "cancelled-1"


@pytest.fixture(scope="module")
def first_run(scheduler_factory, broker):
    """A checkpoint whose first run (--partitions 2, so 4 shards) committed two pending schedules."""
    kafka = Kafka(broker.bootstrap_servers)
    scheduler = scheduler_factory(app_id=APP_ID, extra_args=("--partitions", "2")).start()
    topic = kafka.topic()
    old_due = at(3600)  # pending through both runs however slow the machine: the outcomes below tell what was hit
    sent_up_to = 0
    for request_id in (REPLACED, CANCELLED):
        _, offset = kafka.produce(
            REQUESTS, key=request_id.encode(), value=b"old", headers=native(topic, old_due, request_id), partition=0
        )
        sent_up_to = offset + 1
    wait_until(
        lambda: committed_offsets(scheduler.checkpoint_dir).get(REQUESTS, {}).get(0, 0) >= sent_up_to,
        180,
        "the scheduler to commit the schedules",
        guard=scheduler.assert_running,
    )
    assert scheduler.stop() == 0, scheduler.log()[-2000:]
    return scheduler, topic, old_due


def test_restart_with_other_partitions_keeps_the_shards_so_replace_and_cancel_still_work(
    first_run, kafka, scheduler_factory
):
    first, topic, _old_due = first_run
    reader = kafka.reader(topic)
    # Sent while the scheduler is down: the restarted one reads them in its first batch, where requests act
    # before deliveries, so the test does not depend on how long the restart takes.
    new_due = at(5)
    kafka.produce(
        REQUESTS, key=REPLACED.encode(), value=b"new", headers=native(topic, new_due, REPLACED, "REPLACE"), partition=0
    )
    kafka.produce(REQUESTS, headers=native(request_id=CANCELLED, action="CANCEL"), partition=0)

    restarted = scheduler_factory(
        app_id=APP_ID, checkpoint_dir=first.checkpoint_dir, extra_args=("--partitions", "3")
    ).start()
    mark = 0
    assert "resuming after batch" in restarted.log()

    reader.wait_for(
        lambda r: r.key == REPLACED.encode(), timeout=180, what="the replacement", guard=restarted.assert_running
    )
    # Had the shards followed --partitions, the REPLACE would have found no entry (scheduled, the old version left
    # pending) and the CANCEL nothing to cancel (cancel_noop).
    outcomes = restarted.outcomes_since(mark, expected=2)
    assert outcomes == {"replaced": 1, "cancelled": 1}, outcomes
    delivered = [(r.key, r.value) for r in reader.poll()]
    assert delivered == [(REPLACED.encode(), b"new")], delivered
    [replaced] = [r for r in reader.poll() if r.key == REPLACED.encode()]
    assert replaced.timestamp_ms >= ms_of(new_due)
    log = restarted.log()
    assert "wheel state layout, 4 shards" in log, log[-3000:]
    assert "Spark keeps the 2 shuffle partitions of the checkpoint's first run; --partitions 3 now only" in log
    assert restarted.stop() == 0, restarted.log()[-2000:]


@pytest.mark.parametrize("flag,value,laid_out,keep", [("--shards", "6", "4 shards", "4")])
def test_restart_with_an_explicit_other_setting_is_refused_at_once(first_run, broker, flag, value, laid_out, keep):
    first, _, _ = first_run
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "kafka_scheduler",
            "run",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--app-id",
            APP_ID,
            "--checkpoint-dir",
            str(first.checkpoint_dir),
            flag,
            value,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr == (
        f"kafka-scheduler run: error: {flag} {value} does not match checkpoint "
        f"{first.checkpoint_dir}, whose state was laid out in {laid_out} at its first run: "
        f"omit {flag} to keep {keep}, or use a new --checkpoint-dir\n"
    )
    # The whole of stderr is the one line: Spark, which logs as it starts, was never started.
