"""The metrics, free of Kafka and Spark: rejection reason classes, per-topic outcome counts of the wheel, a batch
summary and the timed writer's writes turned into metric values, and a metrics port in use. A scrape of the real
job: tests/integration/test_metrics.py."""

from __future__ import annotations

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

# Reasons as the decoders and the sink write them (dialects/*.py, engine/driver/record_sink.py,
# engine/driver/timed_writer.py).
REASONS = {
    "missing x-scheduler-deliver-to": "missing_field",
    "missing schedule id (the record key is empty)": "missing_field",
    "empty x-scheduler-request-id": "missing_field",
    "unparseable x-scheduler-deliver-at 'tomorrow' (expected ISO-8601 like 2026-05-24T12:30:00Z)": "bad_time",
    "x-scheduler-deliver-at '2026-05-24T12:30' has no time zone (add Z or an offset like +02:00)": "bad_time",
    "due time is more than 36525 days ahead": "bad_time",
    "invalid scheduler-epoch 'soon' (expected Unix seconds, like 1893456000)": "bad_time",
    "schedule_target_epoch '-5' is negative": "bad_time",
    "invalid time 'x' (expected epoch milliseconds)": "bad_time",
    "destination topic '__consumer_offsets' is not allowed": "bad_destination",
    "invalid destination topic name 'a b'": "bad_destination",
    "invalid schedule_target_partition 'x' (expected a partition number, like 0)": "bad_destination",
    "value too large: 2000000 bytes, the limit is 1000000": "too_large",
    "malformed JSON schedule (expected one JSON object)": "malformed",
    "malformed Avro schedule: the value is 12 bytes longer than the schedule it holds": "malformed",
    "invalid base64 in key": "malformed",
    "unknown x-scheduler-action 'MOVE' (expected ADD, REPLACE, CANCEL, CRON_ADD, CRON_PAUSE, CRON_RESUME or "
    "CRON_CANCEL)": "malformed",
    "duplicate header 'x-scheduler-deliver-at'": "malformed",
    "unsupported schedule_schema_version 'x'": "malformed",
    "destination topic 'gone' does not exist": "refused_by_destination",
    "not authorized to write to destination topic 'secret'": "refused_by_destination",
    "destination partition 7 of topic 'few' does not exist (it has 2 partitions)": "refused_by_destination",
    "record of 9000000 bytes (key, value and headers) is too large for destination topic 'small' "
    "(max.message.bytes 1000)": "refused_by_destination",
    "expired: due 2026-11-26T09:00:00.000Z, not delivered within its max lateness of 600000 ms": "expired",
    "x-scheduler-cron-expr '* * * * * */2' fires every 2s at times, more often than the minimum interval 5s "
    "(--cron-min-interval)": "too_frequent",
    "invalid x-scheduler-cron-expr '* * *' (expected a cron expression like '*/5 * * * *', or six fields with the "
    "seconds last, like '* * * * * */5')": "malformed",
    "invalid x-scheduler-cron-expr '0 0 30 2 *': it never fires": "malformed",
    "unknown time zone 'Mars/Base' (expected an IANA name like Europe/Paris)": "bad_time",
    "missing x-scheduler-cron-expr": "missing_field",
    "x-scheduler-cron-end-at is before x-scheduler-cron-start-at": "bad_time",
    "x-scheduler-cron-start-at '2030-01-01T00:00' has no time zone (add Z or an offset like +02:00)": "bad_time",
    "invalid x-scheduler-cron-missed-fire-policy 'later' (expected replay or skip)": "malformed",
    "invalid x-scheduler-max-lateness '10x' (expected a positive duration like 10m, 1h30m, PT10M, or milliseconds)": (
        "malformed"
    ),
    "something nobody wrote yet": "other",
}


@pytest.mark.parametrize("reason,expected", REASONS.items())
def test_each_rejection_reason_falls_in_its_class(reason, expected):
    assert reason_class(reason) == expected and reason_class(reason.encode()) == expected


def test_a_quoted_value_never_picks_the_class():
    # The quoted topic name mentions time and size: the reason is still about the destination.
    assert reason_class("destination topic 'time-too-large' is not allowed") == "bad_destination"
    assert reason_class(None) == "other" and set(REASONS.values()) == set(CLASSES)


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
