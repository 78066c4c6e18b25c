"""Schedules as entries frames and back: what the rules file in a chunk is what they read from it, every field, also
through the Arrow blob a chunk is stored as (its nullable int columns come back as Int32/Int64)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.processor.blobs import from_blob, to_blob
from kafka_scheduler.engine.rules import entries
from kafka_scheduler.engine.rules.fields import ENTRY_COLUMNS
from kafka_scheduler.engine.rules.schedule import Cron, Schedule, WriteBack

# Times and lengths up to 2**53 ms (the year 287,396): pandas holds an int column with a gap as float64, exact
# that far.
millis = st.integers(0, 2**53)
optional_bytes = st.none() | st.binary(max_size=6)
headers = st.lists(st.tuples(st.text(max_size=3), st.binary(max_size=3)), max_size=2).map(tuple)
write_backs = st.builds(WriteBack, st.text(min_size=1, max_size=4), st.integers(0, 2**31 - 1), optional_bytes, headers)
crons = st.builds(
    Cron,
    st.sampled_from(["* * * * *", "*/5 9-17 * * 1-5"]),
    st.none() | st.just("Europe/Paris"),
    st.sampled_from(["replay", "skip"]),
    st.none() | millis,
    st.none() | millis,
)
schedules = st.builds(
    Schedule,
    millis,
    st.text(min_size=1, max_size=4),
    optional_bytes,
    optional_bytes,
    headers,
    st.text(min_size=1, max_size=8),
    partition=st.none() | st.integers(0, 2**31 - 1),
    partition_key=optional_bytes,
    write_back=st.none() | write_backs,
    history=st.booleans(),
    max_lateness_ms=st.none() | millis,
    cron=st.none() | crons,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(schedules, max_size=6), st.booleans())
def test_schedules_come_back_from_their_entries_frame_and_from_a_chunk(items, through_a_chunk):
    frame = entries.entries_frame(items)
    assert list(frame.columns) == ENTRY_COLUMNS and len(frame) == len(items)
    if through_a_chunk:
        frame = from_blob(to_blob(frame))
    assert entries.schedules_of(frame) == items


@pytest.mark.parametrize("rows_at_a_time", [1, 2, entries.NAMED_ROWS_SLICE])
def test_named_rows_are_the_rows_itertuples_gives(monkeypatch, rows_at_a_time):
    monkeypatch.setattr(entries, "NAMED_ROWS_SLICE", rows_at_a_time)
    frame = pd.DataFrame(
        {
            "due_ms": [5, 6, 7],
            "topic": ["a", None, "c"],
            "partition": pd.array([1, None, 2], dtype="Int32"),
            "history": [True, False, True],
            "1st": [b"x", b"y", b"z"],
            "class": [0.5, float("nan"), 1.5],
        }
    )
    expected = list(frame.itertuples(index=False))
    rows = list(entries.named_rows(frame))
    assert (
        [row._fields for row in rows]
        == [row._fields for row in expected]
        == [("due_ms", "topic", "partition", "history", "_4", "_5")] * 3
    )
    as_python = lambda value: repr(int(value) if isinstance(value, np.integer) else value)
    assert [list(map(as_python, row)) for row in rows] == [list(map(as_python, row)) for row in expected]
    assert [type(row.partition) for row in rows] == [int, type(pd.NA), int]  # Python ints, not numpy's
    assert list(entries.named_rows(frame.iloc[:0])) == []
