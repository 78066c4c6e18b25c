"""The timed writer's early path (engine/driver/early_book.py): an ADD or REPLACE read as it arrives is written at its
due time once the frontier has passed it, and agrees with what the batches hand over later: the same version is
written once, an identical older version keeps its id (the request is a no-op), a different one is dropped."""

from __future__ import annotations

import time

import pytest

from kafka_scheduler.delivery_ids import delivery_id
from kafka_scheduler.engine.contract import KIND_DELIVER, KIND_REJECT, WriterRow
from kafka_scheduler.engine.driver.batch_summary import EarlyTally
from kafka_scheduler.engine.driver.early_cancels import Arrival
from kafka_scheduler.engine.driver.early_requests import EarlyRequest
from kafka_scheduler.engine.driver.timed_writer import TimedWriter
from kafka_scheduler.engine.rules.rejections import expiry_headers
from kafka_scheduler.protocol import DELIVERY_ID

from .test_timed_writer import FakeProducer

TOPIC = "app-schedule-requests"


def now_ms() -> int:
    return int(time.time() * 1000)


def sid(name: str) -> bytes:
    return f"id:{TOPIC}/{name}".encode()


def request(
    name: str,
    offset: int,
    due_ms: int,
    value: bytes = b"v",
    partition: int = 0,
    stamp: int = 0,
    max_lateness_ms: int | None = None,
):
    return EarlyRequest(
        "ADD",
        sid(name),
        Arrival(TOPIC, partition, offset, stamp),
        due_ms,
        "out",
        b"k",
        value,
        (("h", b"1"),),
        max_lateness_ms,
    )


def handed(name: str, offset: int, due_ms: int, value: bytes = b"v", partition: int = 0) -> WriterRow:
    """A version as a batch hands it over: its delivery id the last header, as the sink writes it."""
    made = delivery_id(TOPIC, partition, offset)
    return WriterRow(
        made,
        due_ms,
        KIND_DELIVER,
        "out",
        None,
        b"k",
        value,
        [("h", b"1"), (DELIVERY_ID, made.encode())],
        True,
        None,
        sid(name),
    )


@pytest.fixture
def writer():
    instance = TimedWriter("unused", producer=FakeProducer())
    yield instance
    instance.close()


def sent(writer) -> list:
    return list(writer._producer.values)


def settle(writer, seconds: float = 0.3) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.01)


def test_an_early_version_waits_for_the_frontier_then_goes_out_at_its_due_time(writer):
    due = now_ms() + 200
    assert writer.hold_early(request("a", 10, due))
    settle(writer, 0.4)
    assert sent(writer) == []  # due, but no committed batch has handed over what is due by then
    writer.advance_frontier(due)
    assert writer.wait_written(now_ms(), timeout=5) and _wait(lambda: sent(writer) == [b"v"])
    assert writer.take_written_early() == EarlyTally(written=1)
    # The batch that reads the ADD hands the version over: not written again, counted as left out.
    writer.hold([handed("a", 10, due)])
    settle(writer)
    assert sent(writer) == [b"v"] and writer.take_written_early() == EarlyTally(delivered_again=1)


def test_a_version_due_before_the_frontier_goes_out_at_once(writer):
    writer.advance_frontier(now_ms() + 3000)
    writer.hold_early(request("a", 10, now_ms() - 5))
    assert _wait(lambda: sent(writer) == [b"v"])
    assert writer._producer.sent[0][2] == b"k"


def test_a_batch_handing_the_version_over_makes_it_an_ordinary_held_one(writer):
    due = now_ms() + 150
    writer.hold_early(request("a", 10, due))
    writer.hold([handed("a", 10, due)])  # no frontier: the state's version needs none
    assert _wait(lambda: sent(writer) == [b"v"]) and writer.written_early == 0


def test_an_identical_older_version_keeps_its_id_and_the_early_one_goes(writer):
    """A REPLACE identical to its pending version is a no-op: the state keeps the older version and its id."""
    due = now_ms() + 150
    writer.hold_early(request("a", 20, due))
    writer.hold([handed("a", 10, due)])  # made before the request read early, identical
    writer.advance_frontier(due + 1000)
    assert _wait(lambda: len(writer._producer.values) == 1)
    settle(writer)
    assert writer.written_early == 0 and writer.early_left == 1 and sent(writer) == [b"v"]


def test_a_different_older_version_is_dropped_and_the_early_one_written(writer):
    due = now_ms() + 150
    writer.hold_early(request("a", 20, due, value=b"new"))
    writer.hold([handed("a", 10, due, value=b"old")])
    writer.advance_frontier(due + 1000)
    assert _wait(lambda: sent(writer) == [b"new"])
    settle(writer)
    assert sent(writer) == [b"new"] and writer.withdrawn_early == 1


def test_held_versions_an_early_request_meets(writer):
    due = now_ms() + 60_000
    writer.hold([handed("same", 10, due), handed("other", 11, due, value=b"old")])
    assert not writer.hold_early(request("same", 20, due))  # identical: a no-op, nothing held
    assert writer.hold_early(request("other", 21, due, value=b"new"))  # different: the old one goes
    assert writer.withdraw([delivery_id(TOPIC, 0, 11)]) == 0 and writer.withdraw([delivery_id(TOPIC, 0, 10)]) == 1


def test_an_id_with_an_early_version_leaves_it_and_its_next_requests_to_the_batches(writer):
    """An ADD and an ADD again of one id read together: the state keeps the second, so neither goes out early."""
    due = now_ms() + 100
    assert writer.hold_early(request("a", 10, due))
    assert not writer.hold_early(request("a", 11, due + 100, value=b"other"))
    assert writer.early_unconfirmed() == {} and writer.early_left == 1
    writer.advance_frontier(due + 1000)
    settle(writer, 0.4)
    assert sent(writer) == []


@pytest.mark.parametrize(
    "action, due",
    [(b"REPLACE", "2999-01-01T00:00:00Z"), (b"REPLACE", "tomorrow"), (b"CRON_ADD", "x"), (b"PAUSE", "x")],
    ids=["far-off", "invalid", "cron-action", "unknown-action"],
)
def test_a_request_of_its_id_the_early_path_does_not_take_leaves_the_early_version_to_the_batches(writer, action, due):
    """A REPLACE due far off (or any request the early path cannot tell) read after an early version: only the
    state can say what becomes of that version. A CRON_ADD names a cron's id, another id: the version stays."""
    early_due = now_ms() + 100
    assert writer.hold_early(request("a", 10, early_due))
    headers = [("x-scheduler-request-id", b"a"), ("x-scheduler-action", action), ("x-scheduler-deliver-at", due)]
    writer.read_early([(TOPIC, 0, 11, 0, None, (b"k", b"v", headers))], lambda *fields: None)
    stays = action == b"CRON_ADD"
    assert writer.early_unconfirmed() == ({sid("a"): delivery_id(TOPIC, 0, 10)} if stays else {})
    writer.advance_frontier(early_due + 1000)
    settle(writer, 0.4)
    assert sent(writer) == ([b"v"] if stays else [])


def test_a_cancel_read_after_an_early_version_drops_it(writer):
    due = now_ms() + 100
    writer.hold_early(request("a", 10, due))
    writer.read_early([(TOPIC, 0, 11, 0, sid("a"), None)])
    writer.advance_frontier(due + 1000)
    settle(writer, 0.4)
    assert sent(writer) == []


def test_a_cancel_read_before_but_made_after_leaves_the_request_to_the_batches(writer):
    """Read from another partition first, stamped later: the CANCEL acts after the ADD, which is not held."""
    writer.read_early([(TOPIC, 1, 3, 2_000, sid("a"), None)])
    assert not writer.hold_early(request("a", 10, now_ms() + 100, stamp=1_000))


def test_what_a_committed_batch_read_and_did_not_hand_over_is_left_to_the_batches(writer):
    due = now_ms() + 100
    writer.hold_early(request("a", 10, due))
    writer.forget_cancels({TOPIC: {0: 11}})
    writer.advance_frontier(due + 1000)
    settle(writer, 0.4)
    assert sent(writer) == [] and writer.early_left == 1


def test_a_herd_slice_at_its_due_time_leaves_it_to_the_batches(writer):
    due = now_ms() + 50
    writer.herd_covers = lambda due_ms: due_ms == due
    writer.hold_early(request("a", 10, due))
    writer.hold_early(request("b", 11, due + 1))
    writer.advance_frontier(due + 1000)
    assert _wait(lambda: len(sent(writer)) == 1)
    settle(writer)
    assert writer.early_left == 1 and writer.written_early == 1


def test_a_version_a_batch_writes_itself_takes_over_from_the_early_one(writer):
    writer.hold_early(request("a", 10, now_ms() + 60_000))
    assert writer.early_unconfirmed() == {sid("a"): delivery_id(TOPIC, 0, 10)}
    writer.emitted_by_batch([(sid("a"), delivery_id(TOPIC, 0, 3))])
    assert writer.early_unconfirmed() == {} and writer.early_left == 1


def test_a_batch_waits_for_no_early_version(writer):
    """Batches wait for what the state prepared; an early version is not the state's until handed over (waiting
    for it would wait for the frontier, which only the batch moves)."""
    writer.hold_early(request("a", 10, now_ms() - 10))
    assert writer.wait_written(now_ms(), timeout=2)


def _wait(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def test_a_batch_is_late_only_by_what_it_writes_itself(writer):
    """The batch line's and the metric's lateness: a version written early, as its request was read, is left out of
    the earliest due time the hand-over reports, and so is one held until its due time."""
    early_due = now_ms() - 4000
    writer.advance_frontier(now_ms() + 3000)
    writer.hold_early(request("a", 10, early_due))
    assert _wait(lambda: sent(writer) == [b"v"])
    due_now = now_ms() - 50
    earliest = writer.hold(
        [handed("a", 10, early_due), handed("b", 11, due_now, value=b"b"), handed("c", 12, now_ms() + 60_000)]
    )
    assert earliest == due_now
    assert writer.hold([handed("c", 12, now_ms() + 60_000)]) is None


def expired_by_the_batch(name: str, offset: int, due_ms: int, max_lateness_ms: int) -> WriterRow:
    """The version as a batch hands it over once its state found the request past its max lateness: a rejection that
    keeps the delivery id and due time (sink_columns.expiry_columns)."""
    delivered = handed(name, offset, due_ms)
    return delivered._replace(
        kind=KIND_REJECT,
        topic="rejections",
        headers=[*delivered.headers, *expiry_headers(due_ms, max_lateness_ms, delivered.delivery_id)],
        held=False,
        max_lateness_ms=max_lateness_ms,
    )


@pytest.mark.parametrize("late_when_read", [True, False])
def test_a_version_written_early_that_the_batch_expires_is_counted_once(late_when_read):
    """The writer counts what it writes (delivered, or expired when it writes it later than its max lateness); the
    batch that reads the request later may find it expired too. Its rejection is left out, and the batch's count of
    it taken back (EarlyTally.expired_again), so the expired metric counts the request once."""
    producer = FakeProducer()
    writer = TimedWriter("unused", producer=producer, rejections_topic="rejections")
    expired_counts = []
    writer.on_written = lambda lateness, refused, expired=0: expired_counts.append(expired)
    try:
        writer.advance_frontier(now_ms() + 3000)
        due = now_ms() - (5000 if late_when_read else 5)
        assert writer.hold_early(request("a", 10, due, max_lateness_ms=1000))
        assert _wait(lambda: len(producer.sent) == 1)
        assert producer.sent[0][1] == ("rejections" if late_when_read else "out")
        assert writer.expired == (1 if late_when_read else 0)
        assert writer.take_written_early() == EarlyTally(written=0 if late_when_read else 1)
        writer.hold([expired_by_the_batch("a", 10, due, 1000)])
        settle(writer)
        assert len(producer.sent) == 1
        assert writer.take_written_early() == EarlyTally(expired_again=1)
        assert sum(expired_counts) == (1 if late_when_read else 0)
    finally:
        writer.close()
