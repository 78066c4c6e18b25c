"""``--exactly-once`` end to end: a kill -9 right after the timed writer wrote held deliveries, before a batch
retired them from state, makes the restarted job emit them again; a read_committed consumer still sees each
delivery, and each rejection, once."""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime

from kafka_scheduler.client.scheduler_client import format_instant

from .support import at, ms_of, native, wait_until

LOOKAHEAD = "20s"


def instant(ms: int) -> str:
    return format_instant(datetime.fromtimestamp(ms / 1000, UTC))


def test_a_kill_9_after_held_deliveries_were_written_writes_none_of_them_twice(kafka, scheduler_factory):
    args = ("--exactly-once", "--lookahead", LOOKAHEAD)
    first = scheduler_factory(app_id="exactly-once", extra_args=args).start().warm_up()
    requests = f"{first.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic, committed=True)
    rejections = kafka.reader(f"{first.app_id}-schedule-rejections", committed=True)
    due = ms_of(at(24))
    # Held by the driver from ~20 s before their due times, spread over 1.5 s so that the kill falls among them.
    schedules = {f"k{i}".encode(): due + 5 * i for i in range(300)}
    overdue = {f"now{i}".encode(): due - 60_000 for i in range(5)}
    kafka.produce_many(
        requests,
        [
            dict(key=k, value=k, headers=native(topic, instant(d), k.decode()), partition=i % 2)
            for i, (k, d) in enumerate({**schedules, **overdue}.items())
        ]
        + [
            dict(key=b"bad", value=b"v", headers=native(topic, "not-a-time", "bad"), partition=0),
            dict(headers=native(request_id="k7", action="CANCEL"), partition=1),
        ],
    )
    wait_until(
        lambda: sum(r.key in schedules for r in reader.poll()) >= 100,
        120,
        "the writer to write a hundred held deliveries",
        guard=first.assert_running,
    )
    first.kill_tree()
    written_before_kill = sum(r.key in schedules for r in reader.poll())  # the overdue ones were retired

    second = scheduler_factory(app_id="exactly-once", extra_args=args, checkpoint_dir=first.checkpoint_dir).start()
    expected = set(schedules) - {b"k7"} | set(overdue)
    try:
        reader.wait_for(
            lambda r: r.key in expected,
            count=len(expected),
            timeout=180,
            what="every schedule",
            guard=second.assert_running,
        )
        rejections.wait_for(lambda r: r.key == b"bad", timeout=60, what="the rejection", guard=second.assert_running)
        second.mark(timeout=180)
        second.mark(timeout=180)  # two batches after: whatever the restart re-emitted has been through the writer
        records = reader.read_to_end()
    finally:
        code = second.stop()
    ledger = re.search(r"ledger \S+ holds (\d+) record", second.log())
    assert ledger and int(ledger.group(1)) >= written_before_kill, "the restarted job read back what was written"
    counts = Counter(r.key for r in records)
    assert counts == Counter(dict.fromkeys(expected, 1)), {k: n for k, n in counts.items() if n != 1}
    assert all(r.timestamp_ms >= schedules[r.key] for r in records if r.key in schedules), "delivered early"
    assert Counter(r.key for r in rejections.read_to_end()) == Counter({b"bad": 1})
    assert code == 0
