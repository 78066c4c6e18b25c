"""Changing --lookahead on an existing checkpoint loses nothing.

Schedules are made under one lookahead, the scheduler is stopped gracefully once it has committed
them, and restarted on the same checkpoint with another lookahead: every schedule is still delivered,
exactly once and never before its due time. Timers armed under the old lookahead must not be read
back with the new one.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, datetime

import pytest

from kafka_scheduler.client.scheduler_client import format_instant
from kafka_scheduler.engine.spark.checkpoint import committed_offsets

from .support import at, ms_of, native, wait_until

SCHEDULES = 10
LAYOUTS = ["wheel"]


def change_lookahead(kafka, scheduler_factory, layout: str, before: str, after: str) -> None:
    app_id = f"la-change-{layout}-{uuid.uuid4().hex[:6]}"
    first = scheduler_factory(app_id=app_id, extra_args=("--state-layout", layout, "--lookahead", before)).start()
    requests = f"{app_id}-schedule-requests"
    topic = kafka.topic("la-change")
    reader = kafka.reader(topic)

    # Due 20-34 s after sending: after the restart below on an idle machine, during it on a busy one.
    dues = {f"s{i}".encode(): at(20 + i * 1.5) for i in range(SCHEDULES)}
    sent = kafka.produce_many(
        requests,
        [
            dict(key=key, value=key, headers=native(topic, due, f"id-{key.decode()}"), partition=0)
            for key, due in dues.items()
        ],
    )
    delivery_ids = {key: f"{requests}-{partition}-{offset}".encode() for key, (partition, offset) in zip(dues, sent)}
    end = max(offset for _, offset in sent) + 1
    try:
        wait_until(
            lambda: committed_offsets(first.checkpoint_dir).get(requests, {}).get(0, 0) >= end,
            120,
            "the scheduler to commit the requests",
            guard=first.assert_running,
        )
    finally:
        code = first.stop()
    assert code == 0, first.log()[-3000:]
    # On a slow machine some fall due before the stop: the first run delivers them (the reader keeps them, checked
    # below with the rest, early or twice); the others carry their timers across the restart.

    second = scheduler_factory(
        app_id=app_id, checkpoint_dir=first.checkpoint_dir, extra_args=("--state-layout", layout, "--lookahead", after)
    ).start()
    try:
        assert "resuming after batch" in second.log()
        # A marker due after every schedule, made under the new lookahead: once it is here, nothing more can come.
        last_due_ms = max(ms_of(due) for due in dues.values())
        marker_due = format_instant_ms(max(last_due_ms + 2000, int(time.time() * 1000) + 2000))
        kafka.produce(requests, key=b"marker", value=b"m", headers=native(topic, marker_due), partition=0)
        reader.wait_for(
            lambda r: r.key == b"marker",
            timeout=ms_of(marker_due) / 1000 - time.time() + 120,
            what="the marker",
            guard=second.assert_running,
        )
        second.mark()  # the marker's batch has committed: everything it wrote is readable
        records = [r for r in reader.read_to_end() if r.key != b"marker"]
    finally:
        code = second.stop()  # not left running (and loading the machine) when the test fails

    keys = Counter(r.key for r in records)
    missing = sorted(k.decode() for k in dues if keys[k] == 0)
    assert keys == Counter(dict.fromkeys(dues, 1)), (
        f"lookahead {before} -> {after} ({layout}): expected each of {SCHEDULES} schedules once; "
        f"missing {missing}, delivered {dict(keys)}"
    )
    assert Counter(r.header("x-scheduler-delivery-id") for r in records) == Counter(delivery_ids.values())
    early = [
        (r.key.decode(), ms_of(dues[r.key]) - r.timestamp_ms) for r in records if r.timestamp_ms < ms_of(dues[r.key])
    ]
    assert not early, f"delivered before the due time (key, ms early): {early}"
    assert code == 0, second.log()[-3000:]


def format_instant_ms(epoch_ms: int) -> str:
    return format_instant(datetime.fromtimestamp(epoch_ms / 1000, UTC))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shorter_lookahead_on_restart_loses_nothing(kafka, scheduler_factory, layout):
    change_lookahead(kafka, scheduler_factory, layout, before="1500ms", after="0s")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_longer_lookahead_on_restart_loses_nothing(kafka, scheduler_factory, layout):
    change_lookahead(kafka, scheduler_factory, layout, before="0s", after="2s")
