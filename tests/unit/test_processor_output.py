"""What the state processor hands Spark: a handler call's frames merged (processor/output.py merged), as Spark's Python
worker converts them to Arrow, and the state schemas parsed on the driver (parsed_state_schemas)."""

from __future__ import annotations

import warnings
from collections import Counter

import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.conversion import PandasToArrowConversion
from pyspark.sql.types import LongType, StructField, StructType

from kafka_scheduler.engine.contract import OUTPUT_COLUMNS, OUTPUT_SCHEMA
from kafka_scheduler.engine.processor.input import pack_by_shard, unpacked
from kafka_scheduler.engine.processor.output import (
    MERGED_ROWS,
    OUTPUT_DTYPES,
    batch_time_frame,
    deliveries_frame,
    merged,
    outcomes_frame,
    rejections_frame,
    timer_frame,
    withdraw_frame,
)
from kafka_scheduler.engine.processor.wheel_processor import STATE_VARIABLES, WheelProcessor, parsed_state_schemas
from kafka_scheduler.engine.rules.entries import entries_frame
from kafka_scheduler.engine.rules.schedule import Cron, Schedule
from kafka_scheduler.engine.spark.query import record_rows
from kafka_scheduler.protocol import CRON_FIRE_TIMESTAMP, DELIVERY_ID

NOW = 1_900_000_000_000


def deliveries(n: int, start: int = 0, partitioned: bool = False) -> pd.DataFrame:
    """``n`` delivery rows; ``partitioned``: with an explicit partition (the Int32 columns of other dialects)."""
    entries = entries_frame(
        [
            Schedule(
                NOW + i,
                "out",
                b"k%d" % i,
                b"v",
                (("h", b"1"),),
                f"in-0-{start + i}",
                partition=i % 3 if partitioned else None,
            )
            for i in range(n)
        ],
        [(None, None)] * n,
    )
    return deliveries_frame(entries, NOW - 1)


def spark_arrow(frame: pd.DataFrame) -> pa.RecordBatch:
    """As the Python worker of transformWithStateInPandas converts a frame a handler yields (pyspark worker.py)."""
    return PandasToArrowConversion.convert(
        [frame],
        StructType([StructField("_0", OUTPUT_SCHEMA)]),
        timezone="UTC",
        safecheck=True,
        arrow_cast=True,
        assign_cols_by_name=True,
        int_to_decimal_coercion_enabled=False,
    )


def a_call(sizes: list[int]) -> list[pd.DataFrame]:
    """The frames of one handler call: deliveries of the given sizes (a handler yields none empty) between the
    small rows a call reports, an empty outcome frame among them (a call with nothing to count yields one)."""
    frames = [timer_frame([NOW + 1000]), outcomes_frame(Counter())]
    for i, n in enumerate(sizes):
        frames.append(deliveries(n, start=sum(sizes[:i]), partitioned=i % 2 == 1))
    frames += [withdraw_frame(["in-0-x"]), outcomes_frame(Counter({"scheduled": 3})), batch_time_frame(NOW)]
    return frames


@settings(max_examples=15, deadline=None)
@given(st.lists(st.sampled_from([1, 7, MERGED_ROWS // 2, MERGED_ROWS + 1]), max_size=4))
def test_merged_frames_carry_every_row_in_as_few_frames_as_the_limit_allows(sizes):
    frames = a_call(sizes)
    out = list(merged(iter(frames)))
    assert spark_rows(out) == spark_rows(frames)  # the same rows reach Spark, whatever dtypes pandas picked
    large = sum(1 for f in frames if len(f) > MERGED_ROWS)
    small_rows = sum(len(f) for f in frames if len(f) <= MERGED_ROWS)
    assert len(out) <= large + 1 + small_rows // MERGED_ROWS


def spark_rows(frames: list[pd.DataFrame]) -> list:
    rows = [row["_0"] for frame in frames for row in spark_arrow(frame).to_pylist()]
    return sorted(rows, key=repr)


def test_a_large_frame_passes_before_the_call_goes_on():
    """A herd's slices stream: merged hands a large frame on without waiting for the frames after it."""
    produced = []

    def call():
        produced.append("small")
        yield batch_time_frame(NOW)
        produced.append("large")
        yield deliveries(MERGED_ROWS + 1)
        produced.append("after")
        yield batch_time_frame(NOW)

    first = next(merged(call()))
    assert len(first) == MERGED_ROWS + 1 and produced == ["small", "large"]


def test_a_calls_frames_merge_with_one_dtype_per_column_and_no_pandas_warning():
    """Frames of every kind (timers, outcomes, withdrawals, native and partitioned deliveries, an empty outcome frame)
    concatenate with nothing for pandas to guess: its FutureWarning on all-null columns is an error here."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        [out] = merged(iter(a_call([1, 7, 3])))
    assert {name: str(dtype) for name, dtype in out.dtypes.items()} == OUTPUT_DTYPES
    assert spark_rows([out]) == spark_rows(a_call([1, 7, 3]))


def test_a_call_of_small_frames_yields_one_frame_and_a_call_of_one_yields_it():
    assert len(list(merged(iter(a_call([1, 7]))))) == 1
    alone = batch_time_frame(NOW)
    assert [len(f) for f in merged(iter([alone]))] == [1]
    assert [len(f) for f in merged(iter([deliveries(MERGED_ROWS), alone]))] == [MERGED_ROWS, 1]


class RecordingHandle:
    def __init__(self):
        self.schemas = {}

    def getValueState(self, name, schema):
        self.schemas[name] = (schema,)

    def getMapState(self, name, key_schema, value_schema):
        self.schemas[name] = (key_schema, value_schema)


def test_the_processor_asks_for_each_state_variable_with_its_parsed_schema(spark):
    parsed = parsed_state_schemas()
    processor = WheelProcessor(parsed_schemas=parsed)
    handle = RecordingHandle()
    processor.init(handle)
    assert set(handle.schemas) == {name for name, *_ in STATE_VARIABLES.values()}
    for name, *ddl in STATE_VARIABLES.values():
        assert handle.schemas[name] == tuple(parsed[d] for d in ddl)
        assert all(isinstance(s, StructType) for s in handle.schemas[name])
    assert parsed["seq long"] == StructType([StructField("seq", LongType())])


def test_a_workers_first_state_step_freezes_what_it_has_loaded_once(spark):
    """PySpark's daemon collects a reused worker's garbage after every task: what the worker loaded before its
    first state step (modules) is frozen out of those collections by the processor's init, once per process."""
    import gc

    from kafka_scheduler.engine.processor.wheel_processor import freeze_what_the_worker_has_loaded

    gc.unfreeze()
    try:
        WheelProcessor(parsed_schemas=parsed_state_schemas()).init(RecordingHandle())
        frozen = gc.get_freeze_count()
        assert frozen > 10_000  # the modules pytest, PySpark and pandas have loaded
        assert not freeze_what_the_worker_has_loaded()  # once per process
        WheelProcessor(parsed_schemas=parsed_state_schemas()).init(RecordingHandle())
        assert gc.get_freeze_count() <= frozen  # nothing frozen again (a frozen object may still be freed)
    finally:
        gc.unfreeze()


def test_the_sink_reads_each_row_with_its_headers_zipped_and_a_deliverys_id_last(spark):
    firing = Schedule(
        NOW + 5_000,
        "out",
        b"k",
        b"tick",
        (("h", b"1"), ("empty", None)),
        "in-0-9@1",
        cron=Cron("* * * * * */5", "UTC", "skip", NOW, None),
    )
    bare_firing = Schedule(NOW + 7_000, "out", None, b"x", (), "in-0-8@1", cron=firing.cron)
    entries = entries_frame(
        [firing, Schedule(NOW + 1, "out", None, b"x", (), "in-0-3"), bare_firing],
        [(b"cron:in/a", b"d" * 16), (None, None), (b"cron:in/b", b"e" * 16)],
    )
    rejected = pd.DataFrame(
        [(b"k", b"v", [{"key": "a", "value": b"2"}], "in-1-17", "bad")],
        columns=["key", "value", "raw_headers", "delivery_id", "reason"],
    )
    frames = [deliveries_frame(entries, NOW), rejections_frame(rejected, "rejections"), timer_frame([NOW])]
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(spark_arrow(f).column(0)) for f in frames])
    rows = record_rows(spark.createDataFrame(table, schema=OUTPUT_SCHEMA)).collect()
    assert rows[0].asDict().keys() == {*OUTPUT_COLUMNS, "headers"} - {"header_names", "header_values", "delivery_id"}
    headers = [None if r["headers"] is None else [(h["key"], h["value"]) for h in r["headers"]] for r in rows]
    assert headers[0] == [
        ("h", b"1"),
        ("empty", None),
        (CRON_FIRE_TIMESTAMP, str((NOW + 5_000) // 1000).encode()),
        (DELIVERY_ID, b"in-0-9@1"),
    ]
    assert headers[1] == [(DELIVERY_ID, b"in-0-3")]
    assert headers[2] == [(CRON_FIRE_TIMESTAMP, str((NOW + 7_000) // 1000).encode()), (DELIVERY_ID, b"in-0-8@1")]
    assert [h[0] for h in headers[3]] == [
        "a",
        "x-scheduler-rejection-reason",
        "x-scheduler-source-topic",
        "x-scheduler-source-partition",
        "x-scheduler-source-offset",
    ]
    assert headers[4] is None  # a timer row


request_headers = st.lists(st.tuples(st.text(max_size=2), st.none() | st.binary(max_size=2)), max_size=2)
request_rows = st.lists(
    st.tuples(
        st.sampled_from([-1, 0, 1, 3]), st.binary(max_size=4), st.none() | st.integers(0, 2**53), request_headers
    ),
    max_size=30,
)
REQUEST_TYPE = pa.schema(
    [
        ("shard", pa.int32()),
        ("sid", pa.binary()),
        ("due_ms", pa.int64()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ]
)


@settings(max_examples=50, deadline=None)
@given(st.lists(request_rows, max_size=3))
def test_requests_packed_by_shard_come_back_whole_each_with_its_shard(batches):
    """The state step's input (spark/query.py packed_by_shard): each Arrow batch's rows in one blob per shard; a
    handler call reads its shard's blobs back as one frame."""
    arrow_batches = [
        pa.RecordBatch.from_pylist(
            [
                dict(zip(REQUEST_TYPE.names, (s, sid, due, [{"key": k, "value": v} for k, v in headers])))
                for s, sid, due, headers in rows
            ],
            schema=REQUEST_TYPE,
        )
        for rows in batches
    ]
    blobs: dict = {}
    for packed in pack_by_shard(iter(arrow_batches)):
        assert packed.schema.names == ["shard", "requests"]
        for shard, blob in zip(packed.column(0).to_pylist(), packed.column(1).to_pylist()):
            blobs.setdefault(shard, []).append(blob)
    sent = {}
    for rows in batches:
        for row in rows:
            sent.setdefault(row[0], []).append(row)
    assert blobs.keys() == sent.keys()
    for shard, shard_blobs in blobs.items():
        frames = [pd.DataFrame({"shard": [shard] * len(shard_blobs), "requests": shard_blobs})]
        frame = unpacked(frames)
        back = [
            (int(s), bytes(sid), None if pd.isna(due) else int(due), [(h["key"], h["value"]) for h in headers])
            for s, sid, due, headers in zip(frame["shard"], frame["sid"], frame["due_ms"], frame["headers"])
        ]
        assert sorted(back, key=repr) == sorted(sent[shard], key=repr)
    assert unpacked([]) is None
