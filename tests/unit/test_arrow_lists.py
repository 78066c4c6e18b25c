"""The state step's header lists as Arrow (processor/blobs.py header_lists) and PySpark's conversion taught to take them
as they are (processor/arrow_lists.py): the rows that reach Spark are the ones Python lists made."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.conversion import PandasToArrowConversion
from pyspark.sql.pandas import types as pyspark_types
from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType

from kafka_scheduler.engine.contract import OUTPUT_SCHEMA
from kafka_scheduler.engine.processor import arrow_lists, blobs
from kafka_scheduler.engine.processor.output import (
    OUTPUT_DTYPES,
    deliveries_frame,
    merged,
    records_frame,
    timer_frame,
    withdraw_frame,
)
from kafka_scheduler.engine.rules.entries import entries_frame
from kafka_scheduler.engine.rules.schedule import Cron, Schedule
from kafka_scheduler.protocol import CRON_FIRE_TIMESTAMP

NOW = 1_900_000_000_000
HEADER_LISTS = StructType(
    [StructField("header_names", ArrayType(StringType())), StructField("header_values", ArrayType(BinaryType()))]
)


def converted(frame: pd.DataFrame, schema: StructType) -> list:
    """As the Python worker of transformWithStateInPandas converts a frame a handler yields (pyspark worker.py)."""
    batch = PandasToArrowConversion.convert(
        [frame],
        StructType([StructField("_0", schema)]),
        timezone="UTC",
        safecheck=True,
        arrow_cast=True,
        assign_cols_by_name=True,
        int_to_decimal_coercion_enabled=False,
    )
    return [row["_0"] for row in batch.to_pylist()]


headers = st.lists(st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=3)
cells = st.lists(st.tuples(st.none() | headers, st.booleans()), max_size=40)


@settings(max_examples=80, deadline=None)
@given(cells)
def test_header_lists_reach_spark_as_python_lists_would_with_a_header_appended_where_asked(rows):
    """Rows with headers, none (null or empty: a null list), and a header appended to some (a cron's instant)."""
    column = pd.Series([None if h is None else list(h) for h, _ in rows], dtype=object)
    appended = pd.array([a for _, a in rows], dtype=bool).to_numpy(dtype=bool)
    added = [b"%d" % i for i, (_, a) in enumerate(rows) if a]
    expected = []
    for i, (h, a) in enumerate(rows):
        pairs = list(h or ()) + ([(CRON_FIRE_TIMESTAMP, b"%d" % i)] if a else [])
        expected.append(
            {"header_names": [k for k, _ in pairs], "header_values": [v for _, v in pairs]}
            if pairs
            else {"header_names": None, "header_values": None}
        )
    assert arrow_lists.arrow_lists_pass()
    names, values = blobs.header_lists(column, (appended, CRON_FIRE_TIMESTAMP, added))
    assert isinstance(names.dtype, pd.ArrowDtype) and isinstance(values.dtype, pd.ArrowDtype)
    frame = pd.DataFrame({"header_names": names, "header_values": values})
    assert converted(frame, HEADER_LISTS) == expected
    # Merged with a call's small frames, they become Python lists again (output.with_output_dtypes), nulls as None.
    records = records_frame("deliver", ["out"] * len(rows), None, None, (names, values), [NOW] * len(rows))
    [out] = merged(iter([records, timer_frame([NOW])]))
    got = converted(out, OUTPUT_SCHEMA)
    assert [{k: r[k] for k in ("header_names", "header_values")} for r in got[: len(rows)]] == expected


def test_without_the_pass_header_lists_are_python_objects_as_before(monkeypatch):
    monkeypatch.setattr(blobs, "arrow_lists_pass", lambda: False)
    names, values = blobs.header_lists(pd.Series([[("a", b"1")], None], dtype=object))
    assert names.dtype == object and list(names[0]) == ["a"] and names[1] is None
    frame = pd.DataFrame({"header_names": names, "header_values": values})
    assert converted(frame, HEADER_LISTS) == [
        {"header_names": ["a"], "header_values": [b"1"]},
        {"header_names": None, "header_values": None},
    ]


def test_only_an_arrow_list_column_passes_pysparks_converter_untouched():
    create = pyspark_types._create_converter_from_pandas
    assert getattr(create, "passes_arrow_lists", False)
    list_type = ArrayType(StringType())
    arrow = pd.Series(pd.arrays.ArrowExtensionArray(pa.array([["a"], None], pa.list_(pa.string()))))
    assert create(list_type)(arrow) is arrow
    objects = pd.Series([("a", "b"), None], dtype=object)  # PySpark makes each a list
    assert create(list_type)(objects).tolist() == [["a", "b"], None]
    longs = pd.Series([1, 2])
    assert create(LongType())(longs) is longs
    assert arrow_lists.install()  # again: the factory is wrapped once
    assert not getattr(create.__closure__[0].cell_contents, "passes_arrow_lists", False)


def test_a_herds_delivery_rows_convert_as_with_python_lists(monkeypatch):
    """deliveries_frame for one-shots with and without headers and cron firings, both ways."""
    cron = Cron("* * * * * */5", "UTC", "skip", NOW, None)
    schedules = [
        Schedule(
            NOW + i * 1000, "out", b"k", b"v", (("h", b"%d" % i),) * (i % 3), f"in-0-{i}", cron=cron if i % 4 else None
        )
        for i in range(12)
    ]
    sids = [(b"cron:in/%d" % i, b"d" * 16) if s.cron else (None, None) for i, s in enumerate(schedules)]
    entries = entries_frame(schedules, sids)
    as_arrow = converted(deliveries_frame(entries, NOW), OUTPUT_SCHEMA)
    monkeypatch.setattr(blobs, "arrow_lists_pass", lambda: False)
    as_objects = converted(deliveries_frame(entries, NOW), OUTPUT_SCHEMA)
    assert as_arrow == as_objects
    assert as_arrow[1]["header_names"] == ["h", CRON_FIRE_TIMESTAMP] and as_arrow[0]["header_names"] is None


def test_a_chunk_smaller_than_a_merge_keeps_its_lists_as_arrow_and_reaches_spark_whole():
    """A herd's chunk under MERGED_ROWS is merged with the call's small frames (a timer, a withdrawal): the merged
    frame's header lists stay Arrow (several chunks, made one for Spark), and its rows are the frames' rows."""
    schedules = [Schedule(NOW + i, "out", b"k", b"v", (("h", b"%d" % i),) * (i % 2), f"in-0-{i}") for i in range(50)]
    frames = [
        deliveries_frame(entries_frame(schedules, [(None, None)] * 50), NOW),
        timer_frame([NOW]),
        withdraw_frame(["in-0-1"]),
        deliveries_frame(entries_frame(schedules[:3], [(None, None)] * 3), NOW),
    ]
    [out] = merged(iter(frames))
    assert {name: str(out[name].dtype) for name in ("header_names", "header_values")} == {
        name: OUTPUT_DTYPES[name] for name in ("header_names", "header_values")
    }
    assert isinstance(out["header_names"].dtype, pd.ArrowDtype)
    assert converted(out, OUTPUT_SCHEMA) == [row for frame in frames for row in converted(frame, OUTPUT_SCHEMA)]
