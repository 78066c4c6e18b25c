"""The timed writer: deliveries prepared ahead are held by the driver until their due instant.

A replace or cancel read after a version was prepared, but before it was written, withdraws it. A kill -9
while prepared deliveries are held loses none of them: the state keeps them until a batch after their due
time retires them, so the next run delivers them, with the same delivery id, never early.
"""

from __future__ import annotations

from collections import Counter

import pytest

from .support import at, batch_lines, ms_of, native, wait_until

LOOKAHEAD = "20s"  # a prepared delivery is held 20 s: time enough, even on a loaded machine, for a cancel read after it


def held_since(scheduler, mark: int) -> int:
    return sum(b.held for b in batch_lines(scheduler.log_since(mark)))


@pytest.fixture
def warm(scheduler_factory):
    """A started job with --lookahead 20s, past its slow first batches."""
    def start(app_id: str, checkpoint_dir=None, lookahead: str = LOOKAHEAD):
        return scheduler_factory(app_id=app_id, extra_args=("--lookahead", lookahead),
                                 **({"checkpoint_dir": checkpoint_dir} if checkpoint_dir else {})).start().warm_up()
    return start


def test_a_cancel_or_replace_read_after_preparation_withdraws_the_prepared_delivery(kafka, warm):
    # Held 60 s: the cancel must be read after the preparation and before the due time, whatever the batches' pace
    # (a full suite on 2 cores once took 10 s from preparation to holding, and 10 s more to read the cancel).
    scheduler = warm("withdraw", lookahead="60s")
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    mark = scheduler.mark()
    due = at(70)
    kafka.produce_many(requests, [dict(key=k, value=b"first", headers=native(topic, due, k.decode()), partition=0)
                                  for k in (b"cancelled", b"replaced", b"kept")])
    # Prepared 60 s before its due time, i.e. about 10 s from now: held by the driver from then on.
    wait_until(lambda: held_since(scheduler, mark) >= 3, 90, "the three deliveries to be prepared and held",
               guard=scheduler.assert_running)
    assert not reader.poll(), "written before its due time"
    mark = scheduler.mark()
    kafka.produce_many(requests, [
        dict(headers=native(request_id="cancelled", action="CANCEL"), partition=0),
        dict(key=b"replaced", value=b"second", headers=native(topic, due, "replaced", action="REPLACE"), partition=0)])
    wait_until(lambda: "withdrawn before their due time" in scheduler.log_since(mark), 60,
               "the withdrawals", guard=scheduler.assert_running)
    reader.wait_for(lambda r: r.key == b"kept", timeout=120, what="the kept delivery", guard=scheduler.assert_running)
    reader.wait_for(lambda r: r.key == b"replaced", timeout=60, what="the replaced delivery",
                    guard=scheduler.assert_running)
    scheduler.mark()  # later batches have committed: anything still to come would be written by now
    records = reader.read_to_end()
    assert Counter(r.key for r in records) == Counter({b"kept": 1, b"replaced": 1}), [r.key for r in records]
    assert {r.key: r.value for r in records} == {b"kept": b"first", b"replaced": b"second"}
    assert all(r.timestamp_ms >= ms_of(due) for r in records), "delivered before its due time"
    assert scheduler.stop() == 0


def test_a_kill_9_while_deliveries_are_held_loses_none_of_them(kafka, warm, tmp_path):
    first = warm("kill-9")
    requests = f"{first.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    mark = first.mark()
    dues = {f"k{i}".encode(): at(22 + i) for i in range(4)}
    sent = kafka.produce_many(requests, [dict(key=k, value=k, headers=native(topic, d, k.decode()), partition=0)
                                         for k, d in dues.items()])
    delivery_ids = {k: f"{requests}-{p}-{o}".encode() for k, (p, o) in zip(dues, sent)}
    wait_until(lambda: held_since(first, mark) >= 1, 60, "a delivery to be prepared and held",
               guard=first.assert_running)
    first.kill_tree()
    assert not reader.poll(), "written before its due time"

    second = warm("kill-9", checkpoint_dir=first.checkpoint_dir)
    try:
        reader.wait_for(lambda r: r.key in dues, count=len(dues), timeout=180, what="every schedule",
                        guard=second.assert_running)
        second.mark()
        records = [r for r in reader.read_to_end() if r.key in dues]
    finally:
        code = second.stop()
    assert Counter(r.key for r in records) == Counter(dict.fromkeys(dues, 1)), [r.key for r in records]
    assert {r.key: r.header("x-scheduler-delivery-id") for r in records} == delivery_ids
    assert all(r.timestamp_ms >= ms_of(dues[r.key]) for r in records), "delivered before its due time"
    assert code == 0
