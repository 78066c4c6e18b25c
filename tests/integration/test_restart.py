"""Durable state: stop the scheduler gracefully, restart it on the same checkpoint.

Pending schedules survive; one that fell due while it was down is delivered on restart;
one cancelled before the stop never fires; nothing already delivered is delivered again.
"""

from __future__ import annotations

import time
from collections import Counter

from kafka_scheduler.engine.checkpoint import committed_offsets

from .support import at, ms_of, native, wait_until


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
    due_while_down = at(8)
    send(b"due-while-down", native(topic, due_while_down, "r-down"))
    send(b"cancelled", native(topic, at(9), "r-cancel"))
    send(None, native(request_id="r-cancel", action="CANCEL"))
    due_after_restart = at(45)
    send(b"after-restart", native(topic, due_after_restart, "r-after"))
    wait_until(lambda: all(committed_offsets(scheduler.checkpoint_dir).get(requests, {}).get(p, 0) >= o
                           for p, o in sent_up_to.items()), 60, "the scheduler to commit the requests")

    assert scheduler.stop() == 0, scheduler.log()[-2000:]
    assert "stopped after" in scheduler.log()
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
