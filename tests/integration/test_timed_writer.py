"""The timed writer: deliveries prepared ahead are held by the driver until their due instant.

A replace or cancel read after a version was prepared, but before it was written, withdraws it. A kill -9
while prepared deliveries are held loses none of them: the state keeps them until a batch after their due
time retires them, so the next run delivers them, with the same delivery id, never early.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from kafka_scheduler.harness import process_tree

from .support import at, batch_lines, ms_of, native, wait_until

LOOKAHEAD = "20s"  # a prepared delivery is held 20 s: time enough, even on a loaded machine, for a cancel read after it


def held_since(scheduler, mark: int) -> int:
    return sum(b.held for b in batch_lines(scheduler.log_since(mark)))


@pytest.fixture
def warm(scheduler_factory):
    """A started job with --lookahead 20s, past its slow first batches."""

    def start(app_id: str, checkpoint_dir=None, lookahead: str = LOOKAHEAD):
        return (
            scheduler_factory(
                app_id=app_id,
                extra_args=("--lookahead", lookahead),
                **({"checkpoint_dir": checkpoint_dir} if checkpoint_dir else {}),
            )
            .start()
            .warm_up()
        )

    return start


def test_a_cancel_or_replace_read_after_preparation_withdraws_the_prepared_delivery(kafka, warm):
    """Withdrawn by the batch that reads a REPLACE or CANCEL; and a CANCEL wins even when no batch can run before the
    due time: with Spark's JVM stopped (SIGSTOP), the driver's timed writer still writes the others at their instant,
    and the CANCELs, read as they arrive (engine/driver/early_cancels.py), withdraw their deliveries: one sent to the
    partition of its ADD, one to another partition (ordered after the ADD by the broker's timestamps)."""
    # Held 60 s: the cancel must be read after the preparation and before the due time, whatever the batches' pace
    # (a full suite on 2 cores once took 10 s from preparation to holding, and 10 s more to read the cancel).
    scheduler = warm("withdraw", lookahead="60s")
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    mark = scheduler.mark()
    due = at(70)
    keys = (b"cancelled", b"replaced", b"kept", b"cancelled-early", b"cancelled-apart")
    kafka.produce_many(
        requests, [dict(key=k, value=b"first", headers=native(topic, due, k.decode()), partition=0) for k in keys]
    )
    # Prepared 60 s before its due time, i.e. about 10 s from now: held by the driver from then on.
    wait_until(
        lambda: held_since(scheduler, mark) >= len(keys),
        90,
        "the deliveries to be prepared and held",
        guard=scheduler.assert_running,
    )
    assert not reader.poll(), "written before its due time"
    mark = scheduler.mark()
    kafka.produce_many(
        requests,
        [
            dict(headers=native(request_id="cancelled", action="CANCEL"), partition=0),
            dict(
                key=b"replaced", value=b"second", headers=native(topic, due, "replaced", action="REPLACE"), partition=0
            ),
        ],
    )
    wait_until(
        lambda: "withdrawn before their due time" in scheduler.log_since(mark),
        60,
        "the withdrawals",
        guard=scheduler.assert_running,
    )
    scheduler.mark()
    jvm = process_tree.spark_jvm(scheduler.process.pid)
    os.kill(jvm, signal.SIGSTOP)
    stopped = scheduler.log_size()
    try:
        kafka.produce(requests, headers=native(request_id="cancelled-early", action="CANCEL"), partition=0)
        kafka.produce(requests, headers=native(request_id="cancelled-apart", action="CANCEL"), partition=1)
        reader.wait_for(lambda r: r.key == b"kept", timeout=120, what="the kept delivery, from the timed writer")
        reader.wait_for(lambda r: r.key == b"replaced", timeout=30, what="the replaced delivery")
        wait_until(lambda: time.time() * 1000 > ms_of(due) + 3000, 30, "3 s past the due time")
        delivered = {r.key for r in reader.read_to_end()}
        assert not {b"cancelled-early", b"cancelled-apart"} & delivered, "a CANCEL read in time lost"
        assert not batch_lines(scheduler.log_since(stopped)), "a batch ran with the JVM stopped"
        resumed = scheduler.log_size()
    finally:
        os.kill(jvm, signal.SIGCONT)
    # The next batches report the delivery the CANCEL withdrew as it arrived, and apply the CANCEL: a no-op once a
    # batch has retired the version, due by then, as it retires one written (docs/protocols.md).
    outcomes = scheduler.outcomes_since(resumed, 2, timeout=120)
    assert sum(outcomes.values()) == 2 and set(outcomes) <= {"cancelled", "cancel_noop"}, outcomes
    log_after = scheduler.log_since(resumed)
    assert "(2 withdrawn before their due time)" in log_after or log_after.count("(1 withdrawn before") == 2, log_after
    assert "arrived in another partition than the id's request before them" in scheduler.log(), "keyed apart unseen"
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
    sent = kafka.produce_many(
        requests, [dict(key=k, value=k, headers=native(topic, d, k.decode()), partition=0) for k, d in dues.items()]
    )
    delivery_ids = {k: f"{requests}-{p}-{o}".encode() for k, (p, o) in zip(dues, sent)}
    wait_until(
        lambda: held_since(first, mark) >= 1, 60, "a delivery to be prepared and held", guard=first.assert_running
    )
    first.kill_tree()
    assert not reader.poll(), "written before its due time"

    second = warm("kill-9", checkpoint_dir=first.checkpoint_dir)
    try:
        reader.wait_for(
            lambda r: r.key in dues, count=len(dues), timeout=180, what="every schedule", guard=second.assert_running
        )
        second.mark()
        records = [r for r in reader.read_to_end() if r.key in dues]
    finally:
        code = second.stop()
    assert Counter(r.key for r in records) == Counter(dict.fromkeys(dues, 1)), [r.key for r in records]
    assert {r.key: r.header("x-scheduler-delivery-id") for r in records} == delivery_ids
    assert all(r.timestamp_ms >= ms_of(dues[r.key]) for r in records), "delivered before its due time"
    assert code == 0


@pytest.mark.parametrize("mode", [(), ("--exactly-once",)], ids=["at-least-once", "exactly-once"])
def test_a_herd_beyond_max_held_goes_out_at_its_instant_while_the_batches_go_on(kafka, scheduler_factory, mode):
    """More deliveries prepared at once than --max-held (a herd) go to the herd writer, which writes them at their
    instant outside the batches (with --exactly-once through the ledger's transactions): requests read meanwhile
    are applied. A cancel of a herd member wins, and an ordinary schedule due before the herd's instant goes out
    before it. (Written by the batch that prepared it, the herd held the job until its instant: the batch's line
    came after it, and both came too late.)"""
    scheduler = (
        scheduler_factory(app_id="herd", extra_args=("--lookahead", "40s", "--max-held", "20", *mode)).start().warm_up()
    )
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic, committed=bool(mode))
    mark = scheduler.mark()
    due = at(50)
    herd = [f"h{i}".encode() for i in range(200)]
    cancelled = herd[::20]
    kafka.produce_many(
        requests, [dict(key=k, value=b"herd", headers=native(topic, due, k.decode()), partition=0) for k in herd]
    )
    # Prepared 40 s before the instant, about 10 s from now, and handed on by a batch that ends at once.
    wait_until(
        lambda: held_since(scheduler, mark) >= len(herd),
        40,
        "the herd to be prepared and handed on",
        guard=scheduler.assert_running,
    )
    assert not reader.poll(), "written before its due time"
    kafka.produce_many(
        requests,
        [dict(headers=native(request_id=k.decode(), action="CANCEL"), partition=0) for k in cancelled]
        + [dict(key=b"ordinary", value=b"o", headers=native(topic, at(5), "ordinary"), partition=0)],
    )
    ordinary = reader.wait_for(
        lambda r: r.key == b"ordinary", timeout=60, what="the ordinary delivery", guard=scheduler.assert_running
    )
    assert ordinary[-1].timestamp_ms < ms_of(due), "the herd held the job until its instant"
    reader.wait_for(
        lambda r: r.key in herd,
        count=len(herd) - len(cancelled),
        timeout=120,
        what="the herd",
        guard=scheduler.assert_running,
    )
    scheduler.mark()  # later batches have committed: anything still to come would be written by now
    records = [r for r in reader.read_to_end() if r.key in herd]
    assert Counter(r.key for r in records) == Counter({k: 1 for k in herd if k not in cancelled}), sorted(
        Counter(r.key for r in records).items()
    )
    assert all(r.timestamp_ms >= ms_of(due) for r in records), "delivered before its due time"
    assert scheduler.stop() == 0


def test_requests_due_before_a_batch_could_reach_them_go_out_as_read(kafka, warm):
    """With Spark's JVM stopped (SIGSTOP) no batch runs: an ADD due within the lookahead of the last committed
    batch goes out at its due time all the same, from the request as the driver read it, with and without a request
    id, and one already due goes out at once; a REPLACE identical to a version held since before is a no-op (that
    version goes out, under its own id, and nothing more while no batch runs); a REPLACE that differs drops the
    version it replaces. Once the batches run again, nothing goes out twice, but for the identical REPLACE: applied
    by a batch after its version went out, the state takes it for a new schedule (docs/protocols.md), delivered then
    under its own id."""
    scheduler = warm("early", lookahead="60s")
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    mark = scheduler.mark()
    held_due = at(40)
    kafka.produce_many(
        requests,
        [
            dict(key=b"same", value=b"first", headers=native(topic, held_due, "same"), partition=0),
            dict(key=b"changed", value=b"first", headers=native(topic, held_due, "changed"), partition=0),
        ],
    )
    wait_until(lambda: held_since(scheduler, mark) >= 2, 90, "two versions held", guard=scheduler.assert_running)
    scheduler.mark()
    jvm = process_tree.spark_jvm(scheduler.process.pid)
    os.kill(jvm, signal.SIGSTOP)
    stopped = scheduler.log_size()
    try:
        soon = at(3)
        kafka.produce_many(
            requests,
            [
                dict(key=b"with-id", value=b"v", headers=native(topic, soon, "with-id"), partition=1),
                dict(key=b"without-id", value=b"v", headers=native(topic, soon), partition=0),
                dict(key=b"already-due", value=b"v", headers=native(topic, at(-1), "already-due"), partition=1),
                dict(key=b"same", value=b"first", headers=native(topic, held_due, "same", "REPLACE"), partition=0),
                dict(key=b"changed", value=b"second", headers=native(topic, soon, "changed", "REPLACE"), partition=0),
            ],
        )
        early = {b"with-id", b"without-id", b"already-due", b"changed"}
        records = reader.wait_for(lambda r: r.key in early, count=4, timeout=60, what="the requests, as read")
        assert {r.key for r in records} == early, [r.key for r in records]
        assert all(r.timestamp_ms >= ms_of(soon) or r.key == b"already-due" for r in records), "delivered early"
        assert not batch_lines(scheduler.log_since(stopped)), "a batch ran with the JVM stopped"
        [kept] = reader.wait_for(lambda r: r.key == b"same", timeout=90, what="the version the no-op REPLACE kept")
        assert not batch_lines(scheduler.log_since(stopped)), "a batch ran with the JVM stopped"
    finally:
        os.kill(jvm, signal.SIGCONT)
    resumed = scheduler.log_size()
    wait_until(
        lambda: "written as their requests were read" in scheduler.log_since(resumed),
        120,
        "a batch line that reports the early deliveries",
        guard=scheduler.assert_running,
    )
    scheduler.mark()  # the batches that applied the requests have committed: anything more would be out by now
    records = reader.read_to_end()
    counts = Counter(r.key for r in records)
    others = {key: n for key, n in counts.items() if key != b"same"}
    assert others == {b"with-id": 1, b"without-id": 1, b"already-due": 1, b"changed": 1}, [r.key for r in records]
    assert counts[b"same"] in (1, 2), [r.key for r in records]
    delivered = {r.key: (r.value, r.header("x-scheduler-delivery-id").decode()) for r in records if r != kept}
    assert delivered[b"changed"][0] == b"second"
    made = {
        (r.header_values("x-scheduler-action") or [b"ADD"])[0]: f"{requests}-0-{r.offset}"
        for r in kafka.reader(requests).read_to_end()
        if r.header_values("x-scheduler-request-id") == [b"same"]
    }
    assert kept.header("x-scheduler-delivery-id").decode() == made[b"ADD"] != made[b"REPLACE"], (kept, made)
    if counts[b"same"] == 2:
        assert delivered[b"same"][1] == made[b"REPLACE"], (delivered[b"same"], made)
    assert scheduler.stop() == 0
