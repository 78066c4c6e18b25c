"""Taking over from Karafka, ETF1 and Sky, and rebuilding state from their topics with --from-beginning.

Their schedule topics hold the truth: schedules, cancels, and the tombstones the old scheduler wrote after its
deliveries. A first start reads them all before delivering anything, so what the old scheduler delivered is
not delivered again; a rebuild does the same with the write-backs this scheduler wrote.
"""

from __future__ import annotations

import subprocess
import time
from collections import Counter

from kafka_scheduler.engine.spark.checkpoint import last_committed_batch

from .support import outcome_counts, wait_until
from .test_dialects import WAIT, avro, epoch_in, etf1, karafka


def test_switch_over_then_rebuild_delivers_each_schedule_once(scheduler_factory, kafka):
    k_topic, e_topic, s_topic = kafka.topic("karafka"), kafka.topic("etf1"), kafka.topic("sky")
    out = kafka.topic("out")
    reader = kafka.reader(out)
    past = epoch_in(-600)

    # What the old schedulers left behind: A, C, D delivered by them (their tombstones follow), B overdue.
    _, a_offset = kafka.produce(k_topic, key=b"A", value=b"A", headers=karafka(out, past))
    kafka.produce(
        k_topic,
        key=b"A",
        value=None,
        headers=karafka(out, past, "tombstone", extra=[("schedule_source_offset", str(a_offset).encode())]),
    )
    kafka.produce(k_topic, key=b"B", value=b"B", headers=karafka(out, past))
    kafka.produce(e_topic, key=b"C", value=b"C", headers=etf1(out, past))
    kafka.produce(e_topic, key=b"C", value=None)
    kafka.produce(
        s_topic, key=b"D", value=avro({"time": past * 1000, "topic": out, "key": b"D", "value": b"D", "headers": {}})
    )
    kafka.produce(s_topic, key=b"D", value=None, headers=[("schedule:expired", b"true")])

    inputs = ("--input", f"{k_topic}:karafka", "--input", f"{e_topic}:etf1", "--input", f"{s_topic}:sky-avro")
    # A per-batch cap of 1 would split the topics over many batches: the first batch must ignore it.
    first = scheduler_factory(extra_args=(*inputs, "--max-requests-per-batch", "1")).start()
    reader.wait_for(lambda r: r.value == b"B", timeout=WAIT, what="overdue B", guard=first.assert_running)
    # Live requests: E due soon, F due much later then cancelled, G due after the rebuild below. F's cancel comes
    # one record a batch (the cap) behind it: due in 20 s, F went out before it on a loaded machine (CI of stop 25).
    kafka.produce(
        s_topic,
        key=b"E",
        value=avro({"time": int(time.time() * 1000) + 3000, "topic": out, "key": b"E", "value": b"E", "headers": {}}),
    )
    kafka.produce(k_topic, key=b"F", value=b"F", headers=karafka(out, epoch_in(900)))
    kafka.produce(k_topic, key=b"F", value=None, headers=karafka(None, None, "cancel"))
    back = kafka.reader(k_topic, s_topic)
    reader.wait_for(lambda r: r.value == b"E", timeout=WAIT, what="E", guard=first.assert_running)
    back.wait_for(
        lambda r: r.value is None and r.key in (b"B", b"E") and r.header_values("x-scheduler-source-offset"),
        count=2,
        timeout=WAIT,
        what="write-backs of B and E",
        guard=first.assert_running,
    )
    # Batches after the first read one record each (the cap): F's cancel may still be on its way.
    wait_until(
        lambda: outcome_counts(first.log())["cancelled"] >= 2, 2 * WAIT, "the cancel of F", guard=first.assert_running
    )
    g_due = epoch_in(40)
    kafka.produce(e_topic, key=b"G", value=b"G", headers=etf1(out, g_due))
    first_counts = outcome_counts(first.log())
    assert first.stop() == 0, first.log()[-3000:]
    assert first_counts["completed"] >= 2, first_counts  # A and D, done by the old schedulers
    assert first_counts["cancelled"] >= 2, first_counts  # C (ETF1's tombstone) and F

    second = scheduler_factory(
        app_id=first.app_id, checkpoint_dir=first.checkpoint_dir, extra_args=(*inputs, "--from-beginning")
    ).start()
    kept = list(first.checkpoint_dir.parent.glob(first.checkpoint_dir.name + ".before-*"))
    assert len(kept) == 1 and (kept[0] / "commits").is_dir(), "the old checkpoint is kept aside, never deleted"
    [g] = reader.wait_for(lambda r: r.value == b"G", timeout=WAIT + 40, what="G", guard=second.assert_running)
    assert g.timestamp_ms >= g_due * 1000
    # G was sent last and due last: once it is in, anything re-delivered by the rebuild is in too.
    kafka.produce(e_topic, key=b"Z", value=b"Z", headers=etf1(out, epoch_in(1)))
    reader.wait_for(lambda r: r.value == b"Z", timeout=WAIT, what="marker Z", guard=second.assert_running)
    assert Counter(r.value for r in reader.poll()) == Counter({b"B": 1, b"E": 1, b"G": 1, b"Z": 1})
    counts = outcome_counts(second.log())
    assert counts["completed"] >= 4, counts  # A, D (old schedulers), B, E (ours)
    assert second.stop() == 0, second.log()[-3000:]


def test_an_input_added_to_a_checkpoint_is_read_from_its_start_and_a_removed_one_is_refused(scheduler_factory, kafka):
    out = kafka.topic("out")
    reader = kafka.reader(out)
    e_topic = kafka.topic("etf1")
    first = scheduler_factory().start()
    native = f"{first.app_id}-schedule-requests:native"
    wait_until(
        lambda: last_committed_batch(first.checkpoint_dir) is not None,
        WAIT,
        "a first commit",
        guard=first.assert_running,
    )
    # Written before the input is added: an ETF1 schedule and its cancel, and one already overdue.
    kafka.produce(e_topic, key=b"cancelled", value=b"cancelled", headers=etf1(out, epoch_in(-60)))
    kafka.produce(e_topic, key=b"cancelled", value=None)
    kafka.produce(e_topic, key=b"overdue", value=b"overdue", headers=etf1(out, epoch_in(-60)))
    assert first.stop() == 0, first.log()[-3000:]

    added = scheduler_factory(
        app_id=first.app_id,
        checkpoint_dir=first.checkpoint_dir,
        extra_args=("--input", native, "--input", f"{e_topic}:etf1"),
    ).start()
    assert f"new input {e_topic} (etf1): read from the earliest offset" in added.log()
    reader.wait_for(
        lambda r: r.value == b"overdue", timeout=WAIT, what="the overdue schedule", guard=added.assert_running
    )
    kafka.produce(e_topic, key=b"marker", value=b"marker", headers=etf1(out, epoch_in(1)))
    reader.wait_for(lambda r: r.value == b"marker", timeout=WAIT, what="marker", guard=added.assert_running)
    assert Counter(r.value for r in reader.poll()) == Counter({b"overdue": 1, b"marker": 1})
    assert added.stop() == 0, added.log()[-3000:]

    removed = subprocess.run(
        [*added.command[: added.command.index("--input")], "--input", f"{e_topic}:etf1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert removed.returncode == 2, removed.stdout + removed.stderr
    assert f"reads input {first.app_id}-schedule-requests:native, missing from the inputs now" in removed.stderr
