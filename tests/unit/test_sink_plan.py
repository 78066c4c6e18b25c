"""The record sink's decisions without Spark (engine/driver/sink_plan.py): where a batch's prepared deliveries go,
which batch is a graceful stop's last and what it writes, the instant a batch waits for the writers up to, what its
summary job's rows say and what its destinations would refuse."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_scheduler.engine.driver.batch_summary import BatchSummary, EarlyTally
from kafka_scheduler.engine.driver.producing import PRODUCER_MAX_BYTES
from kafka_scheduler.engine.driver.sink_plan import (
    Refusals,
    SliceLoad,
    all_to_timed_writer,
    digest,
    due_now_records,
    framed_bytes,
    is_final,
    leave_prepared_out,
    record_limit,
    refusals_of,
    refuses_batch,
    route_slices,
    written_by_ms,
)
from kafka_scheduler.kafka.topics import Destination


def load(number: int, records: int, deliveries: int | None = None, deadline: int | None = None) -> SliceLoad:
    return SliceLoad(number, records, records if deliveries is None else deliveries, deadline)


def test_the_timed_writer_takes_everything_while_it_has_room_counting_what_is_due_now_twice():
    assert all_to_timed_writer(prepared_records=10, due_now=5, room=20)
    assert not all_to_timed_writer(prepared_records=11, due_now=5, room=20)
    assert all_to_timed_writer(prepared_records=0, due_now=0, room=0)


def test_beyond_its_room_the_smallest_slices_go_to_the_timed_writer_and_the_rest_to_the_herd_writer():
    herd, beside, early, late = load(7, 5_000), load(3, 2), load(5, 3), load(9, 4)
    small, big = route_slices([herd, beside, early, late], room=6)
    assert small == [beside, early] and big == [late, herd], "smallest first, while they fit; the rest as sorted"
    assert route_slices([herd], room=6) == ([], [herd])
    assert route_slices([beside, early], room=5) == ([beside, early], [])
    assert route_slices([], room=5) == ([], [])


@given(st.lists(st.integers(1, 50), max_size=12), st.integers(0, 200))
def test_the_slices_the_timed_writer_takes_fit_its_room_and_no_smaller_one_is_left_out(sizes, room):
    slices = [load(number, records) for number, records in enumerate(sizes)]
    small, big = route_slices(slices, room)
    assert sorted(small + big, key=lambda s: s.number) == slices
    assert sum(s.records for s in small) <= room
    if big:
        assert min(s.records for s in big) > room - sum(s.records for s in small)
        assert max((s.records for s in small), default=0) <= min(s.records for s in big)


def summary(**counts) -> BatchSummary:
    made = BatchSummary(1)
    for name, value in counts.items():
        if name == "rejected":
            made.outcomes["rejected"] = value
        else:
            setattr(made, name, value)
    return made


@pytest.mark.parametrize(
    "counts,refusals,partitioned,due_now",
    [
        ({}, Refusals(), {}, 0),
        ({"delivered": 5, "prepared_deliveries": 5}, Refusals(), {}, 0),  # all of it prepared
        ({"delivered": 5, "prepared_deliveries": 5}, Refusals(missing={"gone"}), {}, 1),  # dead letters go out now
        ({"delivered": 5, "prepared_deliveries": 5}, Refusals(), {"out": -1}, 1),
        (
            {"delivered": 7, "prepared_deliveries": 2, "rejected": 3, "expired": 1, "written_back": 4},
            Refusals(),
            {},
            13,
        ),
    ],
)
def test_what_a_batch_writes_at_once(counts, refusals, partitioned, due_now):
    assert due_now_records(summary(**counts), refusals, partitioned) == due_now


def test_a_graceful_stops_last_batch_is_the_first_whose_rules_ran_at_or_after_the_stop():
    assert not is_final(None, 5_000)
    assert not is_final(5_000, None), "no shard ran: the batch has no time"
    assert not is_final(5_000, 4_999)
    assert is_final(5_000, 5_000) and is_final(5_000, 7_000)


@pytest.mark.parametrize(
    "final,batch_time,started,stop_at,expected",
    [
        (False, 900, 1_000, None, 1_000),  # its start
        (False, 900, 1_000, 950, 950),  # stopping: nothing due after the stop is written
        (False, 900, 1_000, 2_000, 1_000),
        (True, 2_500, 3_000, 2_000, 2_500),  # the last batch: what is due by its own time
    ],
)
def test_the_instant_a_batch_waits_for_the_writers_up_to(final, batch_time, started, stop_at, expected):
    assert written_by_ms(final, batch_time, started, stop_at) == expected


def test_batches_are_refused_after_the_last_one_or_at_once_without_a_timed_writer():
    assert not refuses_batch(None, stop_requested=False, has_timed_writer=False)
    assert not refuses_batch(None, stop_requested=True, has_timed_writer=True), "one more batch retires the writes"
    assert refuses_batch(None, stop_requested=True, has_timed_writer=False)
    assert refuses_batch(41, stop_requested=True, has_timed_writer=True)


def test_the_last_batch_writes_nothing_prepared():
    counts = summary(delivered=10, prepared_deliveries=4, prepared_records=6)
    leave_prepared_out(counts)
    assert (counts.delivered, counts.prepared_deliveries, counts.prepared_records) == (6, 0, 0)


def summary_row(kind: str, topic: str | None, **values) -> dict:
    row = dict.fromkeys(
        [
            "records",
            "n",
            "earliest_due",
            "latest_prepared_due",
            "write_backs",
            "max_partition",
            "hashed",
            "last_n",
            "largest",
            "prepared_deliveries",
            "prepared_records",
            "timers",
            "withdrawn",
            "deadline",
            "history_copies",
        ]
    )
    return {**row, "write_backs": 0, "hashed": 0, "history_copies": 0, "kind": kind, "topic": topic, **values}


def test_the_summary_jobs_rows_read_as_the_batchs_digest():
    rows = [
        summary_row("outcome", "scheduled@in", n=3, last_n=1),
        summary_row("outcome", "batch_time", n=10, last_n=5_000),
        summary_row("timer", None, timers=[7_000, 8_000]),
        summary_row("withdraw", None, withdrawn=["in-0-1"]),
        summary_row("expired", "out", records=2, write_backs=1),
        summary_row(
            "deliver",
            "out",
            records=4,
            largest=100,
            earliest_due=900,
            deadline=1_500,
            prepared_deliveries=1,
            latest_prepared_due=9_000,
        ),
        summary_row(
            "deliver",
            "other",
            records=2,
            largest=300,
            earliest_due=800,
            deadline=1_200,
            max_partition=3,
            write_backs=2,
            history_copies=1,
            prepared_records=2,
            latest_prepared_due=4_000,
        ),
        summary_row("deliver", "keyed", records=1, hashed=1),
    ]
    read = digest(rows, 9)
    counts = read.summary
    assert (counts.batch_id, counts.outcomes, counts.batch_time_ms) == (9, Counter({"scheduled": 3}), 5_000)
    assert (counts.delivered, counts.expired, counts.written_back, counts.earliest_due_ms) == (7, 2, 2, 800)
    assert (counts.prepared_deliveries, counts.prepared_records) == (1, 2)
    assert counts.latest_prepared_due_ms == 9_000  # the next run's frontier waits for it (prepared_horizon.py)
    assert read.timers == [7_000, 8_000] and read.withdrawn == ["in-0-1"]
    assert read.per_topic == Counter({"out": 4, "other": 2, "keyed": 1})
    assert read.largest == {"out": 100, "other": 300, "keyed": 0}
    assert read.partitioned == {"other": 3, "keyed": -1}
    assert read.expiry_deadline == 1_200
    assert read.copies == {"write-back", "history"}


def test_what_the_destinations_would_refuse():
    known = {
        "out": Destination(partitions=3, writable=True, max_message_bytes=None),
        "small": Destination(partitions=1, writable=True, max_message_bytes=1_000),
        "denied": Destination(partitions=1, writable=False, max_message_bytes=None),
        "rejections": Destination(partitions=1, writable=True, max_message_bytes=50_000),
    }
    per_topic = Counter({"out": 5, "small": 2, "denied": 3, "gone": 4})
    largest = {"out": 100, "small": framed_bytes(1_000), "denied": 10, "gone": 10}
    refusals = refusals_of(per_topic, largest, {"out": 7, "small": 0}, known, "rejections")
    assert (refusals.missing, refusals.denied) == ({"gone"}, {"denied"})
    assert refusals.oversize == {"small": (1_000, "max.message.bytes 1000")}
    assert refusals.counts == {"out": 3, "small": 1}
    assert refusals.rejection_limit == 50_000 and refusals.any
    assert refusals.of_topics(per_topic) == 7
    assert refusals.beyond({"out": 7, "small": 0}) == {"out": 3}, "partition 7 of a topic of 3"
    assert refusals_of(Counter(), {}, {}, {}, "rejections") == Refusals()
    assert not Refusals().any


def test_a_topics_record_limit_is_its_own_or_the_producers():
    assert record_limit(Destination(1, True, 1_000)) == (1_000, "max.message.bytes 1000")
    assert record_limit(Destination(1, True, None))[0] == PRODUCER_MAX_BYTES
    assert record_limit(Destination(1, True, PRODUCER_MAX_BYTES + 1))[0] == PRODUCER_MAX_BYTES


@pytest.mark.parametrize(
    "early, delivered, expired, dead_lettered",
    [
        (EarlyTally(), 7, 2, 1),
        # Written early: counted as the batch's deliveries.
        (EarlyTally(written=3), 10, 2, 1),
        # The batch handed over a version written early: left out, so not its delivery.
        (EarlyTally(written=1, delivered_again=1), 7, 2, 1),
        # The batch found a version written early past its max lateness: its rejection was left out.
        (EarlyTally(expired_again=1), 7, 1, 1),
        # The batch dead-lettered a version written early: left out, neither its delivery nor its dead letter.
        (EarlyTally(written=1, dead_lettered_again=1), 7, 2, 0),
    ],
)
def test_what_a_batch_counted_of_the_versions_written_early_is_taken_back(early, delivered, expired, dead_lettered):
    """A batch's summary counts its rows before the timed writer leaves out those of versions written early; the
    writer tells how many and as what (EarlyTally). The sink then takes the dead letters from the deliveries."""
    summary = digest(
        [
            summary_row("deliver", "out", records=7),  # one of which the sink dead-letters
            summary_row("expired", "out", records=2),
        ],
        1,
    ).summary
    summary.dead_lettered = 1
    summary.count_early(early)
    summary.delivered -= summary.dead_lettered  # as record_sink does once the writers wrote
    assert (summary.delivered, summary.expired, summary.dead_lettered) == (
        delivered - dead_lettered,
        expired,
        dead_lettered,
    )
    assert summary.written_early == early.written
