"""The per-batch log line (engine.batch_summary.BatchSummary.log_line), the integration tests' parser of it,
and the sink's count of deliveries held until their due time (--lookahead), on local Spark."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_scheduler.config import Config
from kafka_scheduler.engine.driver.batch_summary import BatchSummary
from tests.integration.support import batch_lines, outcome_counts, parse_batch_line

OUTCOMES = ("scheduled", "replaced", "replace_noop", "cancelled", "cancel_noop", "rejected")


def summary(batch_id=42, outcomes=(), delivered=0, held=0, dead_lettered=0, lateness_ms=50) -> BatchSummary:
    return BatchSummary(
        batch_id,
        Counter(dict(outcomes)),
        delivered=delivered,
        held=held,
        dead_lettered=dead_lettered,
        earliest_due_ms=1_000_000 if delivered else None,
        written_at_ms=1_000_000 + lateness_ms,
        compute_s=0.31,
        write_s=0.05,
    )


def test_log_line_shows_the_held_count_only_when_something_was_held():
    held = summary(delivered=5, held=3).log_line()
    assert held == "batch 42: 5 delivered (3 held until due) (max lateness 0.05s) [state 0.31s, write 0.05s]"
    plain = summary(outcomes={"cancelled": 1, "scheduled": 2}, delivered=5, lateness_ms=410).log_line()
    assert plain == (
        "batch 42: 3 requests (1 cancelled, 2 scheduled); 5 delivered (max lateness 0.41s) [state 0.31s, write 0.05s]"
    )
    assert "held" not in plain


def test_parser_reads_the_readme_example():
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as file:
        readme = file.read()
    example = next(line for line in readme.splitlines() if line.startswith("`batch 42:"))
    parsed = parse_batch_line(example.strip("`;."))
    assert parsed is not None and parsed.batch == 42
    assert parsed.outcomes == Counter({"cancelled": 1, "scheduled": 2})
    assert parsed.delivered == 5


def test_parser_ignores_other_lines_and_reads_a_logged_line_with_its_prefix():
    log = "\n".join(
        [
            "05:31:02 INFO  running: reading app-schedule-requests; stop with Ctrl-C or SIGTERM",
            "05:31:09 INFO  first batch done 7.1s after start",
            "05:31:10 INFO  " + summary(7, {"replace_noop": 1, "scheduled": 2}).log_line(),
            "05:31:11 INFO  " + summary(8, {"cancel_noop": 1}, delivered=2, held=1).log_line(),
            "05:31:12 INFO  " + summary(9, {"rejected": 4}, delivered=1, dead_lettered=1).log_line(),
            "05:31:13 INFO  stopped after 12 batches: 3 delivered",
        ]
    )
    lines = batch_lines(log)
    assert [line.batch for line in lines] == [7, 8, 9]
    assert [(line.delivered, line.held, line.dead_lettered) for line in lines] == [(0, 0, 0), (2, 1, 0), (1, 0, 1)]
    assert outcome_counts(log) == Counter({"scheduled": 2, "replace_noop": 1, "cancel_noop": 1, "rejected": 4})


@given(
    batch_id=st.integers(0, 10**9),
    outcomes=st.dictionaries(st.sampled_from(OUTCOMES), st.integers(1, 10**6)),
    delivered=st.integers(0, 10**6),
    held=st.integers(0, 10**6),
    dead=st.integers(0, 10**6),
    lateness_ms=st.integers(-(10**6), 10**7),
)
def test_parser_inverts_log_line(batch_id, outcomes, delivered, held, dead, lateness_ms):
    parsed = parse_batch_line(summary(batch_id, outcomes, delivered, held, dead, lateness_ms).log_line())
    assert parsed is not None
    assert (parsed.batch, parsed.outcomes, parsed.delivered, parsed.held, parsed.dead_lettered) == (
        batch_id,
        Counter(outcomes),
        delivered,
        held,
        dead,
    )


# --- the sink's hold, on a real local SparkSession -------------------------------------------------------

RECORDS_SCHEMA = (
    "kind string, topic string, key binary, value binary, "
    "headers array<struct<key:string,value:binary>>, due_ms bigint, partition int, prepared boolean, "
    "delivery_id string, max_lateness_ms bigint"
)


def records_frame(spark, rows: list, schema: str = RECORDS_SCHEMA):
    """The records of ``rows``, with the schedule id the sink hands to the timed writer (null: these have none)."""
    from pyspark.sql import functions as F

    return spark.createDataFrame(rows, schema).withColumn("sid", F.lit(None).cast("binary"))


class FakeWriter:
    """The timed writer's side of the sink: room, and what was handed over."""

    def __init__(self, room: int, early: dict | None = None):
        self._room = room
        self.rows: list = []
        self.early = early or {}  # sid -> delivery id of the versions held early
        self.emitted: list = []  # what the sink said the batch writes itself, of those ids

    def room(self) -> int:
        return self._room

    def early_unconfirmed(self) -> dict:
        return dict(self.early)

    def written_early_ids(self) -> list:
        return []

    def emitted_by_batch(self, versions) -> None:
        self.emitted.extend(versions)

    def hold(self, rows) -> int:
        rows = list(rows)
        self.rows.extend(rows)
        return len(rows)


def capturing_sink(writer=None):
    """A sink that records what each Kafka write (its own and the herd writer's) would send, and when, instead of
    writing (``saves``)."""
    from kafka_scheduler.engine.driver.record_sink import RecordSink

    saves: list[tuple[int, list]] = []

    def capture(records):
        rows = records.select("kind", "key", "due_ms").collect()
        if rows:
            saves.append((int(time.time() * 1000), rows))

    sink = RecordSink(Config(), topics=None, stop_requested=threading.Event(), writer=writer, kafka_write=capture)
    sink.saves = saves
    return sink


def held_rows(now: int) -> list:
    return [
        ("deliver", "out", b"overdue", b"v", [], now - 1000, None, False, "t-0-1", None),
        ("deliver", "out", b"soon", b"v", [], now + 400, None, True, "t-0-2", None),
        ("deliver", "out", b"later", b"v", [], now + 700, 1, True, "t-0-3", None),
        ("deliver", "out", b"later-too", b"v", [], now + 700, None, True, "t-0-4", None),
        ("history", "app-schedule-history", b"soon", b"v", [], now + 400, None, True, "t-0-2", None),  # a copy
        ("reject", "app-schedule-rejections", b"bad", b"v", [], None, None, None, None, None),
    ]


def test_sink_hands_every_record_to_the_timed_writer_when_it_has_room(spark):
    writer = FakeWriter(room=100)
    sink = capturing_sink(writer)
    held = sink._write(records_frame(spark, held_rows(int(time.time() * 1000)), RECORDS_SCHEMA), 4, 1)
    assert held == 3
    assert sink.saves == [], "no Kafka write job of its own: the writer writes what is due now at once"
    assert sorted((r.delivery_id or "", r.kind, r.key, r.partition, r.held) for r in writer.rows) == [
        ("", "reject", b"bad", None, False),
        ("t-0-1", "deliver", b"overdue", None, False),
        ("t-0-2", "deliver", b"soon", None, True),
        ("t-0-2", "history", b"soon", None, True),
        ("t-0-3", "deliver", b"later", 1, True),
        ("t-0-4", "deliver", b"later-too", None, True),
    ]


def test_beyond_the_writers_room_small_slices_go_to_it_and_the_herd_to_the_herd_writer_which_never_writes_early(spark):
    now = int(time.time() * 1000)
    rows = held_rows(now) + [
        ("history", "app-schedule-history", b"later", b"v", [], now + 700, None, True, "t-0-3", None)
    ]
    writer = FakeWriter(room=2)  # five prepared records: the slice of "soon" (2) fits, that of "later" (3) does not
    sink = capturing_sink(writer)
    held = sink._write(records_frame(spark, rows, RECORDS_SCHEMA), 5, 1)
    assert held == 3
    assert sorted((r.key, r.kind, r.held) for r in writer.rows) == [
        (b"soon", "deliver", True),
        (b"soon", "history", True),
    ]
    # What is due now went out with the batch; the herd goes out at its time, from the herd writer.
    assert Counter(row["key"] for _, batch in sink.saves for row in batch) == Counter({b"overdue": 1, b"bad": 1})
    assert sink.herds.wait_written(now + 700, timeout=30)
    written = Counter(row["key"] for _, batch in sink.saves for row in batch)
    assert written == Counter({b"overdue": 1, b"bad": 1, b"later": 2, b"later-too": 1})
    for saved_at, batch in sink.saves:
        for row in batch:
            assert row["due_ms"] is None or row["due_ms"] <= saved_at, f"{row['key']} written before its due time"
    sink.close()


@pytest.mark.parametrize("prepared", [4, 0], ids=["with-slices", "nothing-prepared"])
def test_the_ids_held_early_that_the_batch_writes_itself_are_told_to_the_writer(spark, prepared):
    """Beyond the writer's room the batch writes what is due itself: the timed writer hears of the ids it holds early
    versions of, before the batch writes anything, so that the batch's versions take over
    (engine/driver/early_book.py)."""
    from pyspark.sql import functions as F

    now = int(time.time() * 1000)
    writer = FakeWriter(room=0, early={b"id:in/a": "in-0-9"})
    sink = capturing_sink(writer)
    records = records_frame(spark, held_rows(now)).withColumn(
        "sid", F.when(F.col("key") == b"overdue", F.lit(b"id:in/a")).when(F.col("key") == b"soon", F.lit(b"id:in/b"))
    )
    saved_when_told = []
    emitted_by_batch = writer.emitted_by_batch
    writer.emitted_by_batch = lambda versions: (saved_when_told.append(len(sink.saves)), emitted_by_batch(versions))
    sink._write(records, prepared, 1)
    assert writer.emitted == [(b"id:in/a", "t-0-1")]
    assert saved_when_told == [0] and sink.saves
    sink.close()


def test_what_was_written_early_is_left_out_and_rejections_stay(spark):
    from kafka_scheduler.engine.driver.sink_columns import records_but

    records = records_frame(spark, held_rows(int(time.time() * 1000)))
    kept = records_but(records, ["t-0-2", "t-0-3"]).select("kind", "key").collect()
    assert sorted((row["kind"], row["key"]) for row in kept) == [
        ("deliver", b"later-too"),
        ("deliver", b"overdue"),
        ("reject", b"bad"),
    ]


def test_sink_without_a_writer_writes_once(spark):
    now = int(time.time() * 1000)
    sink = capturing_sink(None)
    held = sink._write(
        records_frame(spark, [("deliver", "out", b"k", b"v", [], now - 5, None, False, "t-0-1", None)], RECORDS_SCHEMA),
        0,
    )
    assert held == 0 and len(sink.saves) == 1


def test_index_size_reports_are_not_requests_and_keep_the_last_value_per_shard():
    from kafka_scheduler.engine.driver.batch_summary import Totals

    totals = Totals()
    first = BatchSummary(1)
    first.count_outcome("scheduled", 7)
    first.count_outcome("index_entries:0", 12, 5)  # two reports of shard 0 in the batch: the later says 5
    first.count_outcome("index_entries:1", 3)
    assert first.requests == 7 and "index" not in first.log_line() and first.index_entries == {0: 5, 1: 3}
    totals.add(first)
    assert totals.index_total == 8
    second = BatchSummary(2)
    second.count_outcome("index_entries:1", 0, 0)
    totals.add(second)
    assert totals.index_total == 5 and totals.outcomes == Counter({"scheduled": 7})


def test_the_sink_rejects_as_expired_what_it_would_write_later_than_its_max_lateness(spark):
    """Just before Spark writes: a delivery later than its due time plus its max lateness becomes a rejection
    (reason, due time, source of the request; a cron firing's is its activating request's), its history copy is
    dropped; the others go out as they are. Rows the state already marked expired become rejections too."""
    now = int(time.time() * 1000)
    sink = capturing_sink(None)
    summary = BatchSummary(7)
    summary.delivered = 3
    rows = [
        (
            "deliver",
            "out",
            b"late",
            b"v",
            [{"key": "h", "value": b"1"}],
            now - 5000,
            None,
            False,
            "requests-1-9@1767225600000",
            1000,
        ),
        (
            "history",
            "app-schedule-history",
            b"late",
            b"v",
            [],
            now - 5000,
            None,
            False,
            "requests-1-9@1767225600000",
            1000,
        ),
        ("deliver", "out", b"in-time", b"v", [], now - 5000, None, False, "requests-0-3", 60_000),
        ("deliver", "out", b"no-limit", b"v", [], now - 5000, None, False, "requests-0-4", None),
    ]
    records = records_frame(spark, rows, RECORDS_SCHEMA)
    out = {(r["kind"], r["key"]): r for r in sink.columns.expire(records, now - 4000, summary).collect()}
    assert set(out) == {("reject", b"late"), ("deliver", b"in-time"), ("deliver", b"no-limit")}
    late = out[("reject", b"late")]
    assert late["topic"] == sink.config.rejections_topic and late["partition"] is None
    headers = [(h["key"], bytes(h["value"])) for h in late["headers"]]
    assert headers[0] == ("h", b"1")
    reason = dict(headers)["x-scheduler-rejection-reason"].decode()
    assert reason.startswith("expired: due ") and reason.endswith("not delivered within its max lateness of 1000 ms")
    assert dict(headers)["x-scheduler-due-ms"] == str(now - 5000).encode()
    assert [dict(headers)[f"x-scheduler-source-{n}"] for n in ("topic", "partition", "offset")] == [
        b"requests",
        b"1",
        b"9",
    ]
    assert (summary.expired, summary.delivered) == (1, 2)
    # Nothing late: no transformation, no extra Spark job.
    assert sink.columns.expire(records, now + 60_000, summary) is records


def test_rows_the_state_marked_expired_become_rejections(spark):
    sink = capturing_sink(None)
    schema = RECORDS_SCHEMA + (
        ", wb_topic string, wb_partition int, wb_key binary, "
        "wb_headers array<struct<key:string,value:binary>>, history boolean"
    )
    records = records_frame(
        spark,
        [("expired", "out", b"k", b"v", [], 1000, None, False, "requests-0-5@1000", 10, None, None, None, None, False)],
        schema,
    )
    row = sink.columns.expired_as_rejections(records).collect()[0]
    assert (row["kind"], row["topic"]) == ("reject", sink.config.rejections_topic)
    assert {h["key"]: bytes(h["value"]) for h in row["headers"]}["x-scheduler-rejection-reason"] == (
        b"expired: due 1970-01-01T00:00:01.000Z, not delivered within its max lateness of 10 ms"
    )


def test_among_is_isin_parsed_from_one_string_and_looked_up_in_a_hash_set(spark):
    """The filters naming the ids written early: as Column.isin would answer, for values SQL or a regex would
    misread (quotes, backslashes, a newline), nulls and no values at all, and with thousands of values looked up in
    a hash set (InSet), not searched one by one for every row."""
    from pyspark.sql import functions as F

    from kafka_scheduler.engine.driver.sink_columns import among, sids_among

    awkward = ["a*b", "it's", "back\\slash", "two\nlines", "\\'"]
    frame = spark.createDataFrame(
        [("a.b", b"\x00\xff"), ("a*b", b"k"), ("t-0-1", None), (None, b"\x01"), *((v, None) for v in awkward[1:])],
        "delivery_id string, sid binary",
    )
    values = [*awkward, "t-0-1", "[", *(f"t-9-{i}" for i in range(5000))]

    def answers(column):
        return [row[0] for row in frame.select(column).collect()]

    expected = [False, True, True, None, True, True, True, True]
    assert answers(among("delivery_id", values)) == answers(F.col("delivery_id").isin(values[:7])) == expected
    assert answers(among("delivery_id", ["it's"])) == [False, False, False, None, True, False, False, False]
    assert answers(among("delivery_id", [])) == [False, False, False, None, False, False, False, False]
    assert answers(sids_among([b"\x00\xff", b"\x01"]))[:4] == [True, False, None, True]
    plan = frame.filter(among("delivery_id", values))._jdf.queryExecution().optimizedPlan().toString()
    assert " INSET " in plan
