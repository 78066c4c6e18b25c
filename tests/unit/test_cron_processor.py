"""The Spark side of crons and expiry without a Spark session: what the state processor emits for a firing, an expired
delivery and a CRON_ADD the rules refuse, and chunks written before the cron columns existed."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa

from kafka_scheduler.engine.processor import blobs, output
from kafka_scheduler.engine.rules.batch import mark_expired
from kafka_scheduler.engine.rules.entries import entries_frame, schedules_of
from kafka_scheduler.engine.rules.fields import ENTRY_COLUMNS
from kafka_scheduler.engine.rules.schedule import Cron, Schedule
from kafka_scheduler.protocol import CRON_FIRE_TIMESTAMP


def firing(due_ms: int = 1_767_225_605_000, lateness=None) -> Schedule:
    return Schedule(
        due_ms,
        "out",
        b"k",
        b"tick",
        (("h", b"1"),),
        f"requests-0-9@{due_ms}",
        max_lateness_ms=lateness,
        cron=Cron("* * * * * */5", "Europe/Paris", "skip", 1_767_225_600_000, None),
    )


def headers(rows, row: int) -> list:
    """A row's headers as the processor emits them: names and values, zipped."""
    names, values = rows["header_names"][row], rows["header_values"][row]
    return [] if names is None or names is pd.NA else list(zip(names, values))


def test_a_firing_is_delivered_with_kaspr_fire_timestamp_and_its_own_delivery_id():
    frame = entries_frame([firing(), Schedule(1_767_225_605_500, "out", None, b"x", (), "requests-0-3")])
    rows = output.deliveries_frame(frame, now_ms=1_767_225_600_000)
    assert list(rows["kind"]) == ["deliver", "deliver"]
    assert headers(rows, 0) == [("h", b"1"), (CRON_FIRE_TIMESTAMP, b"1767225605")]
    assert headers(rows, 1) == []  # a one-shot: no fire timestamp
    # record_rows adds each delivery's id as its last header (test_processor_output)
    assert list(rows["delivery_id"]) == ["requests-0-9@1767225605000", "requests-0-3"]
    assert list(rows["prepared"]) == [True, True]


def test_rows_marked_expired_are_emitted_as_expired_with_their_max_lateness():
    frame = mark_expired(entries_frame([firing(10_000, lateness=500), firing(10_000, lateness=5000)]), now_ms=11_000)
    rows = output.deliveries_frame(frame, now_ms=11_000)
    assert list(rows["kind"]) == ["expired", "deliver"]
    assert list(rows["max_lateness_ms"]) == [500, 5000]


def test_a_cron_add_the_rules_refuse_is_rejected_as_the_decoder_would():
    rejected = pd.DataFrame(
        [
            (
                b"k",
                b"v",
                [{"key": "x-scheduler-action", "value": b"CRON_ADD"}, {"key": "a", "value": None}],
                "requests-2-17",
                "invalid x-scheduler-cron-expr 'x' (...)",
            )
        ],
        columns=["key", "value", "raw_headers", "delivery_id", "reason"],
    )
    rows = output.rejections_frame(rejected, "app-schedule-rejections")
    assert list(rows["kind"]) == ["reject"] and list(rows["topic"]) == ["app-schedule-rejections"]
    assert headers(rows, 0) == [
        ("x-scheduler-action", b"CRON_ADD"),
        ("a", None),
        ("x-scheduler-rejection-reason", b"invalid x-scheduler-cron-expr 'x' (...)"),
        ("x-scheduler-source-topic", b"requests"),
        ("x-scheduler-source-partition", b"2"),
        ("x-scheduler-source-offset", b"17"),
    ]
    assert rows["delivery_id"][0] is None  # a rejection gets no delivery id header


def test_chunks_keep_cron_columns_and_chunks_written_before_them_read_as_one_shots():
    frame = entries_frame(
        [firing(lateness=600_000), Schedule(5, "out", None, None, (), "t-0-1")],
        [(b"cron:requests/a", b"d" * 16), (None, None)],
    )
    back = blobs.from_blob(blobs.to_blob(frame))
    assert schedules_of(back) == schedules_of(frame)
    # A chunk of the format before issue 19: no expiry or cron columns.
    old_schema = pa.schema([f for f in blobs.CHUNK_SCHEMA if f.name in ENTRY_COLUMNS[:16]])
    old = blobs.ipc_bytes(
        pa.Table.from_pandas(
            frame.iloc[1:][[f.name for f in old_schema]].assign(
                partition=pd.array([None], dtype="Int32"), wb_partition=pd.array([None], dtype="Int32")
            ),
            schema=old_schema,
            preserve_index=False,
        )
    )
    read = blobs.from_blob(old)
    assert list(read.columns) == ENTRY_COLUMNS
    assert schedules_of(read) == [Schedule(5, "out", None, None, (), "t-0-1")]
