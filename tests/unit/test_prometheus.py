"""The metrics, free of Kafka and Spark: rejection reason classes, per-topic outcome counts of the wheel, a batch
summary and the timed writer's writes turned into metric values, and a metrics port in use. A scrape of the real
job: tests/integration/test_metrics.py."""

from __future__ import annotations

import ast
import socket
import time
import urllib.request
from collections import Counter

import pandas as pd
import pytest

from kafka_scheduler.engine.driver.batch_summary import BatchSummary
from kafka_scheduler.engine.processor.output import outcomes_frame, rejection_counts
from kafka_scheduler.engine.rules.batch import apply_requests
from kafka_scheduler.engine.rules.entries import entries_frame
from kafka_scheduler.engine.rules.rejection_classes import CLASSES, reason_class
from kafka_scheduler.engine.rules.schedule import Action, Outcome, Request, Schedule, input_topic_of
from kafka_scheduler.engine.rules.store import MemoryShardStore
from kafka_scheduler.kafka.local_broker import free_port
from kafka_scheduler.ops.http_server import serve
from kafka_scheduler.ops.input_lag import end_offsets
from kafka_scheduler.ops.metrics import SchedulerMetrics

# Every reason text the job writes, one example each, with its class: the decoders' (dialects/*.py), the rules'
# (engine/rules/cron.py: a CRON_ADD they refuse) and the sink's and the timed writer's (a destination's refusal, an
# expiry, a rejection's value left out). test_every_reason_fragment_in_the_code_is_walked keeps the list whole.
REASONS = {
    # native
    "missing x-scheduler-deliver-to": "missing_field",
    "missing x-scheduler-deliver-at": "missing_field",
    "missing x-scheduler-request-id": "missing_field",
    "empty x-scheduler-request-id": "missing_field",
    "unparseable x-scheduler-deliver-at 'tomorrow' (expected ISO-8601 like 2026-05-24T12:30:00Z)": "bad_time",
    "x-scheduler-deliver-at '2026-05-24T12:30' has no time zone (add Z or an offset like +02:00)": "bad_time",
    "unknown x-scheduler-action 'MOVE' (expected ADD, REPLACE, CANCEL, CRON_ADD, CRON_PAUSE, CRON_RESUME or "
    "CRON_CANCEL)": "malformed",
    "invalid x-scheduler-max-lateness '10x' (expected a positive duration like 10m, 1h30m, PT10M, or milliseconds)": (
        "bad_max_lateness"
    ),
    "missing x-scheduler-cron-expr": "missing_field",
    "invalid x-scheduler-cron-missed-fire-policy 'later' (expected replay or skip)": "bad_cron",
    "x-scheduler-cron-end-at is before x-scheduler-cron-start-at": "bad_cron",
    "x-scheduler-cron-start-at '2030-01-01T00:00' has no time zone (add Z or an offset like +02:00)": "bad_time",
    "unparseable x-scheduler-cron-end-at 'soon' (expected ISO-8601 like 2026-05-24T12:30:00Z)": "bad_time",
    # shared by the dialects (dialects/common.py)
    "invalid destination topic name 'a b'": "bad_destination",
    "destination topic '__consumer_offsets' is not allowed": "bad_destination",
    "due time is more than 36525 days ahead": "bad_time",
    "value too large: 2000000 bytes, the limit is 1000000": "too_large",
    "missing schedule id (the record key is empty)": "missing_field",
    "duplicate header 'x-scheduler-deliver-at'": "malformed",
    "invalid x-scheduler-source-offset 'x' (expected an offset, like 42)": "malformed",
    "missing schedule_target_topic": "missing_field",
    "no dialect for this topic": "malformed",
    # Karafka
    "missing schedule_schema_version": "missing_field",
    "schedule_schema_version '2.0.0' is newer than 1.x (not supported)": "malformed",
    "unsupported schedule_schema_version 'x' (expected 1.x, like 1.0.0)": "malformed",
    "missing schedule_source_type": "missing_field",
    "unknown schedule_source_type 'delete' (expected schedule, cancel or tombstone)": "malformed",
    "missing schedule_target_epoch": "missing_field",
    "schedule_target_epoch '-5' is negative": "bad_time",
    "invalid schedule_target_epoch 'soon' (expected Unix seconds, like 1893456000 or 1893456000.5)": "bad_time",
    "invalid schedule_target_partition 'x' (expected a partition number, like 0)": "bad_destination",
    # ETF1
    "missing scheduler-epoch": "missing_field",
    "scheduler-epoch '-5' is negative": "bad_time",
    "scheduler-epoch '1.5' is not a whole number of seconds": "bad_time",
    "invalid scheduler-epoch 'soon' (expected Unix seconds, like 1893456000)": "bad_time",
    # Sky (Avro and JSON)
    "time -5 is negative": "bad_time",
    "missing topic": "missing_field",
    "malformed Avro schedule (neither the AvroSchedule schema nor its older form without headers)": "malformed",
    "malformed Avro schedule: the value is 12 bytes longer than the schedule it holds": "malformed",
    "header name 'caf\ufffd' is not valid UTF-8": "malformed",
    "malformed JSON schedule (expected one JSON object)": "malformed",
    "missing time": "missing_field",
    "invalid time 'x' (expected epoch milliseconds)": "bad_time",
    "missing key": "missing_field",
    "invalid base64 in key": "malformed",
    "invalid headers (expected an object of base64 strings)": "malformed",
    "invalid base64 in headers h1": "malformed",
    # the rules: a CRON_ADD (engine/rules/cron.py)
    "x-scheduler-cron-expr '* * * * * */2' fires every 2s at times, more often than the minimum interval 5s "
    "(--cron-min-interval)": "too_frequent",
    "invalid x-scheduler-cron-expr '* * *' (expected a cron expression like '*/5 * * * *', or six fields with the "
    "seconds last, like '* * * * * */5')": "bad_cron",
    "invalid x-scheduler-cron-expr '0 0 30 2 *': it never fires": "bad_cron",
    "unknown time zone 'Mars/Base' (expected an IANA name like Europe/Paris)": "bad_cron",
    # the sink and the timed writer: a destination's refusal, an expiry, a rejection too large for its topic
    "destination topic 'gone' does not exist": "refused_by_destination",
    "not authorized to write to destination topic 'secret'": "refused_by_destination",
    "destination partition 7 of topic 'few' does not exist (it has 2 partitions)": "refused_by_destination",
    "record of 9000000 bytes (key, value and headers) is too large for destination topic 'small' "
    "(max.message.bytes 1000)": "refused_by_destination",
    "destination topic 'odd' refused the record (Broker: Policy violation)": "refused_by_destination",
    "record of 9000000 bytes (key, value and headers) is too large for destination topic 'small' "
    "(max.message.bytes 1000); its value is left out: the rejections topic takes no record that large": (
        "refused_by_destination"
    ),
    "expired: due 2026-11-26T09:00:00.000Z, not delivered within its max lateness of 600000 ms": "expired",
    "its value is left out: the rejections topic takes no record that large": "too_large",
}


@pytest.mark.parametrize("reason,expected", REASONS.items())
def test_each_rejection_reason_falls_in_its_class(reason, expected):
    assert reason_class(reason) == expected and reason_class(reason.encode()) == expected


def test_a_quoted_value_never_picks_the_class():
    # The quoted topic name mentions time and size: the reason is still about the destination.
    assert reason_class("destination topic 'time-too-large' is not allowed") == "bad_destination"


def test_every_class_is_explained_and_none_is_left_for_other():
    from kafka_scheduler.engine.rules.rejection_classes import ABOUT, OTHER

    assert set(REASONS.values()) == set(CLASSES) - {OTHER}, "every class names a reason the job writes"
    assert set(ABOUT) == set(CLASSES) and all(ABOUT.values())
    assert reason_class("something nobody wrote yet") == OTHER and reason_class(None) == OTHER


def _reason_fragments(path, inside) -> set[str]:
    """The literal text in the nodes ``inside(node)`` picks in the module at ``path`` (calls, functions): string
    constants and the constant parts of f-strings, each run of text between two interpolations on its own."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and ast.get_docstring(node) is not None
    }
    found = set()
    for node in ast.walk(tree):
        if inside(node):
            for part in ast.walk(node):
                if isinstance(part, ast.Constant) and isinstance(part.value, str) and id(part) not in docstrings:
                    found.add(part.value)
    return found


def test_every_reason_fragment_in_the_code_is_walked():
    """Each piece of reason text in the code that writes reasons appears in an example above: a reason added without
    a class (and its wording) fails here."""
    from pathlib import Path

    import kafka_scheduler

    root = Path(kafka_scheduler.__file__).parent

    def spark_lit(node):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "lit"

    def called(name):
        return lambda node: isinstance(node, ast.Call) and getattr(node.func, "id", None) == name

    def function(name):
        return lambda node: isinstance(node, ast.FunctionDef) and node.name == name

    fragments = set()
    for path in sorted((root / "dialects").glob("*.py")):
        fragments |= _reason_fragments(path, spark_lit)
    engine = root / "engine"
    fragments |= _reason_fragments(engine / "driver" / "record_sink.py", spark_lit)
    fragments |= _reason_fragments(engine / "driver" / "timed_writer.py", function("refusal_reason"))
    fragments |= _reason_fragments(engine / "rules" / "cron.py", called("CronError"))
    fragments |= _reason_fragments(engine / "rules" / "cron.py", function("problem"))
    fragments |= _reason_fragments(engine / "rules" / "rejection_classes.py", function("expired_reason"))
    # Plain texts only: an expression's literal with no space is a name, a quote, a format (e.g. "'", "ADD", "base64").
    prose = {f.strip("' ") for f in fragments if " " in f.strip() and not f.startswith("yyyy")}
    prose = {f for f in prose if f}
    unseen = sorted(f for f in prose if not any(f in reason for reason in REASONS))
    assert not unseen, f"reason texts without an example (and so without a checked class): {unseen}"


def test_rejection_rows_are_counted_per_input_topic_and_class():
    frame = pd.DataFrame(
        {
            "src_topic": ["in-a", "in-a", "in-b"],
            "headers": [
                [{"key": "x-scheduler-rejection-reason", "value": b"missing x-scheduler-deliver-to"}],
                [("x-scheduler-rejection-reason", b"value too large: 9 bytes, the limit is 1")],
                [{"key": "x-scheduler-rejection-reason", "value": b"missing x-scheduler-deliver-to"}],
            ],
        }
    )
    counts = rejection_counts(frame)
    assert counts == Counter(
        {
            ("rejected", "in-a", "missing_field"): 1,
            ("rejected", "in-a", "too_large"): 1,
            ("rejected", "in-b", "missing_field"): 1,
        }
    )
    summary = BatchSummary(1)
    for row in outcomes_frame(counts).itertuples():
        summary.count_outcome(row.topic, row.n)
    assert summary.outcomes == Counter({"rejected": 3})  # the log line's count is unchanged
    assert summary.labelled[("rejected", "in-a", "too_large")] == 1


def sid(topic: str, request_id: str) -> bytes:
    return f"id:{topic}/{request_id}".encode()


def test_input_topic_of_every_id_form():
    assert input_topic_of(b"id:orders/a/b") == "orders" and input_topic_of(b"offset:in/0/42") == "in"
    assert input_topic_of(b"\x00rejections") == ""


def test_wheel_counts_outcomes_and_deliveries_at_once_per_input_topic():
    store = MemoryShardStore()
    now = 1_000_000

    def add(topic, rid, due):
        return sid(topic, rid), Request(Action.ADD, Schedule(due, "out", b"k", b"v", (), f"{topic}-0-{rid}"))

    result = apply_requests(
        store,
        [
            add("a", "1", now + 5000),
            add("a", "2", now - 1),
            add("b", "1", now + 9000),
            (sid("b", "1"), Request(Action.CANCEL, None)),
            (sid("b", "9"), Request(Action.CANCEL, None)),
        ],
        now,
    )
    assert result.by_topic == Counter(
        {
            (Outcome.SCHEDULED, "a"): 2,
            (Outcome.SCHEDULED, "b"): 1,
            (Outcome.CANCELLED, "b"): 1,
            (Outcome.CANCEL_NOOP, "b"): 1,
        }
    )
    assert sum(result.by_topic.values()) == sum(result.outcomes.values())
    assert result.at_once == Counter({"a": 1})


def test_bulk_adds_are_counted_per_input_topic_too():
    store = MemoryShardStore()
    now = 1_000_000
    schedules = [
        Schedule(now + 3000, "out", b"k", b"v", (), "in-0-1"),
        Schedule(now - 5, "out", b"k", b"v", (), "in-0-2"),
    ]
    anonymous = entries_frame(schedules).drop(columns=["sid", "digest"]).assign(src_topic=["x", "y"])
    keyed = entries_frame([Schedule(now + 3000, "out", b"k", b"v", (), "z-0-3")]).assign(
        sid=[sid("z", "3")], action=[Action.ADD.value], src_topic=["z"]
    )
    result = apply_requests(store, [], now, anonymous, keyed=keyed)
    assert result.by_topic == Counter(
        {(Outcome.SCHEDULED, "x"): 1, (Outcome.SCHEDULED, "y"): 1, (Outcome.SCHEDULED, "z"): 1}
    )
    assert result.at_once == Counter({"y": 1})


def summary_with(rows: dict, **fields) -> BatchSummary:
    summary = BatchSummary(3, **fields)
    for topic, n in rows.items():
        summary.count_outcome(topic, n)
    return summary


def test_a_batch_summary_becomes_metric_values():
    metrics = SchedulerMetrics({"req": "native", "kar": "karafka"})
    metrics.record_batch(
        summary_with(
            {
                "scheduled@req": 4,
                "replaced@req": 1,
                "cancel_noop@kar": 2,
                "rejected@kar@bad_time": 3,
                "delivered_at_once@req": 2,
                "index_entries:0": 5,
                "index_entries:1": 2,
            },
            written_back=2,
            dead_lettered=1,
            compute_s=0.2,
            write_s=0.1,
            written_at_ms=10_000,
        )
    )
    metrics.follow_next_wakeup(lambda: 20_000)
    v = metrics.value
    assert v("kafka_scheduler_requests_total", {"outcome": "scheduled", "input_topic": "req", "dialect": "native"}) == 4
    assert v("kafka_scheduler_requests_total", {"outcome": "replaced", "input_topic": "req", "dialect": "native"}) == 1
    assert (
        v("kafka_scheduler_requests_total", {"outcome": "cancel_noop", "input_topic": "kar", "dialect": "karafka"}) == 2
    )
    assert (
        v("kafka_scheduler_rejected_total", {"input_topic": "kar", "dialect": "karafka", "reason_class": "bad_time"})
        == 3
    )
    assert v("kafka_scheduler_delivered_at_once_total", {"input_topic": "req", "dialect": "native"}) == 2
    assert v("kafka_scheduler_written_back_total") == 2 and v("kafka_scheduler_dead_lettered_total") == 1
    assert v("kafka_scheduler_pending_schedules") == 7 and v("kafka_scheduler_next_wakeup_timestamp_seconds") == 20
    assert v("kafka_scheduler_batch_duration_seconds_sum") == pytest.approx(0.3)
    assert v("kafka_scheduler_batches_total") == 1 and v("kafka_scheduler_last_batch_timestamp_seconds") == 10
    # Deliveries are counted where they are written: here the timed writer wrote them all.
    assert v("kafka_scheduler_delivered_total") == 0

    metrics.follow_next_wakeup(lambda: None)
    assert v("kafka_scheduler_next_wakeup_timestamp_seconds") == 0
    # A later batch: shard 1 delivered its two; shard 0 reports nothing and keeps its last value.
    metrics.record_batch(summary_with({"index_entries:1": 0}))
    assert v("kafka_scheduler_pending_schedules") == 5
    assert v("kafka_scheduler_requests_total", {"outcome": "scheduled", "input_topic": "req", "dialect": "native"}) == 4


def test_each_delivery_written_counts_once_with_its_lateness():
    metrics = SchedulerMetrics({})
    metrics.record_written([3, 40, 2500], refused=1)
    metrics.record_written([0], refused=0)
    v = metrics.value
    assert v("kafka_scheduler_delivered_total") == 4 and v("kafka_scheduler_dead_lettered_total") == 1
    assert v("kafka_scheduler_delivery_lateness_seconds_count") == 4
    assert v("kafka_scheduler_delivery_lateness_seconds_bucket", {"le": "0.005"}) == 2
    assert v("kafka_scheduler_delivery_lateness_seconds_bucket", {"le": "2.5"}) == 4


def test_deliveries_a_batch_wrote_itself_are_counted_from_its_summary_and_a_herd_as_the_herd_writer_writes_it():
    metrics = SchedulerMetrics({})
    metrics.record_batch(
        summary_with({}, delivered=5, held=2, written_by_batch=3, earliest_due_ms=9_000, written_at_ms=9_400)
    )
    v = metrics.value
    # The three written at once, at the batch's largest lateness; the two held were handed to the herd writer.
    assert v("kafka_scheduler_delivered_total") == 3
    assert v("kafka_scheduler_delivery_lateness_seconds_count") == 3
    assert v("kafka_scheduler_delivery_lateness_seconds_sum") == pytest.approx(1.2)
    metrics.record_herd_written(2, lateness_ms=40)
    assert v("kafka_scheduler_delivered_total") == 5
    assert v("kafka_scheduler_delivery_lateness_seconds_count") == 5
    assert v("kafka_scheduler_delivery_lateness_seconds_sum") == pytest.approx(1.28)


def test_input_lag_from_the_last_progress_and_latest_offsets():
    progress = {"sources": [{"endOffset": '{"req": {"0": 10, "1": 4}, "ticks": {"0": 99}}'}]}
    ends = end_offsets(progress, {"req"})
    assert ends == {("req", 0): 10, ("req", 1): 4}
    metrics = SchedulerMetrics({"req": "native"})
    metrics.record_lag(ends, {("req", 0): 15, ("req", 1): 4})
    assert metrics.value("kafka_scheduler_input_lag_records", {"topic": "req", "partition": "0"}) == 5
    assert metrics.value("kafka_scheduler_input_lag_records", {"topic": "req", "partition": "1"}) == 0


def test_metrics_are_served_over_http():
    metrics = SchedulerMetrics({})
    metrics.record_written([5], 0)
    port = free_port()
    server = serve(metrics, "127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert "kafka_scheduler_delivered_total 1.0" in text and "kafka_scheduler_pending_schedules" in text


def test_run_with_the_metrics_port_in_use_exits_2_naming_the_option(tmp_path, capsys, keep_signal_handlers):
    from kafka_scheduler.cli.main import main

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        # Nothing listens on the bootstrap port: had the job gone on, it would wait for a broker.
        code = main(
            [
                "run",
                "--bootstrap-servers",
                f"127.0.0.1:{free_port()}",
                "--checkpoint-dir",
                str(tmp_path / "ckpt"),
                "--metrics-port",
                str(port),
            ]
        )
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - started < 10
    assert (
        err.startswith(f"kafka-scheduler run: error: --metrics-port {port}: ")
        and "already in use" in err
        and err.count("\n") == 1
    ), err


def test_the_timed_writer_reports_each_delivery_once_and_no_rejection_as_one():
    from confluent_kafka import KafkaError

    from kafka_scheduler.engine.driver.timed_writer import TimedWriter

    from .test_timed_writer import RefusingProducer, row

    metrics = SchedulerMetrics({})
    producer = RefusingProducer({"denied": KafkaError.TOPIC_AUTHORIZATION_FAILED}, {})
    writer = TimedWriter("unused", producer=producer, rejections_topic="app-schedule-rejections")
    writer.on_written = metrics.record_written
    try:
        now = int(time.time() * 1000)
        writer.hold(
            [
                row("req-0-1", now + 50, b"a", topic="denied"),
                row("req-0-2", now + 50, b"b"),
                row("req-0-2", now + 50, b"b", kind="history", topic="hist"),  # the copy of b: no delivery
                row("req-0-3", now + 50, b"c", topic="flaky"),  # fails once, written on the retry
                row(None, None, b"bad", kind="reject", topic="app-schedule-rejections"),
            ]
        )
        assert writer.wait_written(now + 50, timeout=10)
    finally:
        writer.close()
    assert metrics.value("kafka_scheduler_delivered_total") == 2  # b and c
    assert metrics.value("kafka_scheduler_delivery_lateness_seconds_count") == 2
    assert metrics.value("kafka_scheduler_dead_lettered_total") == 1  # a


def test_a_delivery_the_batch_expired_is_no_delivery_when_the_writer_writes_its_rejection():
    """The sink hands a delivery the rules marked expired to the timed writer as a rejection that keeps its due time
    and delivery id (and its write-back): written to the rejections topic, counted in no delivery and no lateness."""
    from kafka_scheduler.engine.driver.timed_writer import TimedWriter

    from .test_timed_writer import FakeProducer, row

    metrics = SchedulerMetrics({})
    writer = TimedWriter("unused", producer=FakeProducer(), rejections_topic="app-schedule-rejections")
    writer.on_written = metrics.record_written
    try:
        now = int(time.time() * 1000)
        long_ago = now - 2_241_000
        writer.hold(
            [
                row("req-0-7", long_ago, b"late", kind="reject", topic="app-schedule-rejections"),
                row("req-0-7", long_ago, b"late", kind="write-back", topic="req"),
                row("req-0-8", now, b"on-time"),
            ]
        )
        assert writer.wait_written(now, timeout=10)
    finally:
        writer.close()
    assert metrics.value("kafka_scheduler_delivered_total") == 1  # on-time only
    assert metrics.value("kafka_scheduler_delivery_lateness_seconds_count") == 1
    assert metrics.value("kafka_scheduler_delivery_lateness_seconds_bucket", {"le": "5.0"}) == 1


def test_deliveries_at_once_leave_out_the_schedules_the_rules_expired():
    """An ADD already later than its max lateness when read is rejected as expired: not delivered at once."""
    from kafka_scheduler.engine.processor.wheel_processor import delivered_at_once

    store = MemoryShardStore()
    now = 10_000_000
    late = Schedule(now - 2_241_000, "out", b"k", b"v", (), "a-0-1", max_lateness_ms=1000)
    on_time = Schedule(now - 10, "out", b"k", b"v", (), "a-0-2")
    result = apply_requests(
        store, [(sid("a", "1"), Request(Action.ADD, late)), (sid("a", "2"), Request(Action.ADD, on_time))], now
    )
    assert result.at_once == Counter({"a": 2})  # the rules count both as due when read
    assert delivered_at_once(result) == Counter({"a": 1})


class _ValueState:
    def __init__(self, value=None):
        self.value = value

    def get(self):
        return self.value


class _Handle:
    def listTimers(self):
        return iter([1_000_000])


class _Clock:
    def getCurrentProcessingTimeInMs(self):
        return 900_000


def test_a_report_tick_alone_reports_the_shards_index_size():
    """At start the driver writes a report tick, which reaches every shard: each reports its index size, so the
    pending gauge after a restart sums every shard, not only those a request or timer has touched since."""
    from kafka_scheduler.engine.contract import INDEX_ENTRIES_PREFIX, KIND_TICK
    from kafka_scheduler.engine.processor.state_store import MapStateShardStore
    from kafka_scheduler.engine.processor.wheel_processor import WheelProcessor

    processor = WheelProcessor()
    processor.handle = _Handle()
    processor.index_token = _ValueState((7, 0, [1], [3], 3))  # version 7, 3 entries
    processor.store = MapStateShardStore(processor)
    tick = pd.DataFrame({"kind": [KIND_TICK]})
    frames = list(processor._input_frames((2,), tick, _Clock()))
    reports = {
        row.topic: row.n for frame in frames for row in frame.itertuples() if str(row.topic).startswith("index_")
    }
    assert reports == {f"{INDEX_ENTRIES_PREFIX}2": 3}
    summary = BatchSummary(1)
    for frame in frames:
        for row in frame[frame["kind"] == "outcome"].itertuples():
            summary.count_outcome(row.topic, row.n, row.n)
    metrics = SchedulerMetrics({})
    metrics.record_batch(summary)
    assert metrics.value("kafka_scheduler_pending_schedules") == 3
