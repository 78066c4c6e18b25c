"""A herd task's conversion of Arrow rows to the transactional sender's items (exactly_once.herd_items), checked
against the plain row-by-row conversion, also for slices of a batch and rows without headers."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.contract import HERD_COLUMNS
from kafka_scheduler.engine.driver.exactly_once import LedgerKeyed, herd_items
from kafka_scheduler.engine.driver.producing import Record

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

row = st.fixed_dictionaries(
    {
        "delivery_id": st.text(min_size=1, max_size=8),
        "due_ms": st.one_of(st.none(), st.integers(0, 2**50)),
        "topic": st.text(min_size=1, max_size=5),
        "partition": st.one_of(st.none(), st.integers(0, 7)),
        "key": st.one_of(st.none(), st.binary(max_size=4)),
        "value": st.one_of(st.none(), st.binary(max_size=6)),
        "headers": st.one_of(
            st.none(),
            st.lists(
                st.fixed_dictionaries(
                    {"key": st.text(max_size=4), "value": st.one_of(st.none(), st.binary(max_size=3))}
                ),
                max_size=3,
            ),
        ),
    }
)


# Arrow's types of the columns a herd task reads (the sink selects HERD_COLUMNS of its records).
TYPES = {
    "delivery_id": pa.string(),
    "due_ms": pa.int64(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "key": pa.binary(),
    "value": pa.binary(),
    "headers": HEADERS,
}


def _batch(rows: list) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([(name, TYPES[name]) for name in HERD_COLUMNS]))


def _row_by_row(rows: list) -> list:
    return [
        (
            LedgerKeyed(r["delivery_id"], r["due_ms"] or 0),
            Record(
                r["topic"], r["partition"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"] or ()]
            ),
        )
        for r in rows
    ]


@settings(max_examples=150, deadline=None)
@given(st.lists(row, max_size=12), st.integers(0, 12), st.integers(0, 12))
def test_items_are_the_rows_in_order_with_their_own_headers(rows, start, length):
    batch = _batch(rows)
    assert herd_items(batch) == _row_by_row(rows)
    assert herd_items(batch.slice(start, length)) == _row_by_row(rows[start : start + length])
