"""Chunks of schedules and index deltas as Arrow IPC blobs (the state's values), and header lists as Arrow, column by
column: no Python object per row where Arrow can take a whole column."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa

from ..rules.cells import header_pairs, missing
from ..rules.entries import ENTRY_FIELDS, with_entry_columns
from ..rules.fields import HEADERS_ARROW, Field
from .arrow_lists import arrow_lists_pass

# Stored in checkpoints: the field table's ENTRY fields, in their order (tests/unit/test_stored_formats.py pins it).
CHUNK_SCHEMA = pa.schema([(f.name, f.arrow) for f in ENTRY_FIELDS])

# due_ms null: the id left the index; sid null: every id due from due_ms to through_ms left it
DELTA_SCHEMA = pa.schema(
    [
        ("sid", pa.binary()),
        ("due_ms", pa.int64()),
        ("delivery_id", pa.string()),
        ("digest", pa.binary()),
        ("through_ms", pa.int64()),
    ]
)

_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")

NULLABLE_INTS = ("Int32", "Int64")


def _pandas_types(field: Field) -> tuple[str, str]:
    """(pandas_type, numpy_type) as ``Table.from_pandas`` records a column of the field's dtype."""
    if field.pandas != "object":
        return field.pandas.lower(), field.pandas
    return (
        "unicode" if pa.types.is_string(field.arrow) else "bytes" if pa.types.is_binary(field.arrow) else "list[object]"
    ), "object"


# What ``Table.from_pandas`` wrote with every chunk (constant): reading a chunk back gives the same dtypes
# (nullable ints as Int32/Int64, not float64) whichever way it was written.
_CHUNK_SCHEMA_WITH_PANDAS = CHUNK_SCHEMA.with_metadata(
    {
        b"pandas": json.dumps(
            {
                "index_columns": [],
                "column_indexes": [],
                "columns": [
                    {
                        "name": f.name,
                        "field_name": f.name,
                        "pandas_type": _pandas_types(f)[0],
                        "numpy_type": _pandas_types(f)[1],
                        "metadata": None,
                    }
                    for f in ENTRY_FIELDS
                ],
                "attributes": {},
                "creator": {"library": "pyarrow", "version": pa.__version__},
                "pandas_version": pd.__version__,
            }
        ).encode()
    }
)


def to_blob(entries: pd.DataFrame) -> bytes:
    """A chunk as an Arrow IPC blob, column by column: through ``Table.from_pandas`` a copy of the frame cost ~4 ms a
    chunk whatever its size, which with coarse levels (a few hundred chunks a batch) was most of an ingest."""
    arrays = []
    for field in ENTRY_FIELDS:
        name, values = field.name, entries[field.name]
        if name == "headers":
            array = header_array(values)
        elif name == "wb_headers":
            array = header_array(values, keep_nulls=True)  # null: no write-back
        elif field.pandas in NULLABLE_INTS:
            array = pa.array(nullable_ints(values, field.pandas), type=field.arrow)
        elif field.pandas == "bool":
            array = pa.array(flags(values), type=field.arrow)
        elif field.pandas == "int64":  # due_ms, entry_bytes: never null
            array = pa.array(values.to_numpy(dtype=np.int64), type=field.arrow)
        else:  # strings and bytes: None, NaN or pd.NA is null (from_pandas)
            array = pa.array(values.to_numpy(dtype=object), type=field.arrow, from_pandas=True)
        arrays.append(array)
    return ipc_bytes(pa.Table.from_arrays(arrays, schema=_CHUNK_SCHEMA_WITH_PANDAS))


def flags(values: pd.Series) -> np.ndarray:
    """``cells.flag`` of every cell, without a Python call per row: a missing one is False."""
    if values.dtype == bool:
        return values.to_numpy()
    present = values.notna().to_numpy()
    result = np.zeros(len(values), dtype=bool)
    result[present] = values[present].astype(bool).to_numpy()
    return result


def header_array(cells, keep_nulls: bool = False) -> pa.ListArray:
    """A headers column as Arrow: in one call where every cell has one form (the tuples of a Schedule, or the dicts
    Arrow hands back), row by row where a frame mixes them. A missing cell is an empty list, or null with
    ``keep_nulls``."""
    try:
        array = pa.array(cells, type=HEADERS_ARROW, from_pandas=True)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        array = pa.array([None if missing(h) else header_pairs(h) for h in cells], type=HEADERS_ARROW)
    if array.null_count and not keep_nulls:
        return pa.ListArray.from_arrays(array.offsets, array.values)  # offsets carry no nulls: empty lists
    return array


def header_lists(cells, appended: tuple | None = None) -> tuple:
    """A headers column as the processor emits it (OUTPUT_SCHEMA): a list of names and a list of values per row, null
    for a row without headers. ``appended``: (a mask of rows, a name, their values in row order), one header added
    at the end of those rows (a cron's firing instant). As Arrow-backed pandas arrays where PySpark's conversion takes
    them as they are (``arrow_lists``); else as arrays of Python lists, which PySpark copies one call a row."""
    array = header_array(cells)
    offsets = array.offsets.to_numpy().astype(np.int64)
    first, flat = int(offsets[0]), int(offsets[-1] - offsets[0])
    keys = array.values.field("key").slice(first, flat)
    values = array.values.field("value").slice(first, flat)
    lengths = np.diff(offsets)
    if appended is not None and appended[0].any():
        rows, name, added = appended
        keys, values, lengths = _with_appended(keys, values, lengths, rows, name, added)
    new_offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), pa.int32())
    none = pa.array(lengths == 0)
    names = pa.ListArray.from_arrays(new_offsets, keys, mask=none)
    values = pa.ListArray.from_arrays(new_offsets, values, mask=none)
    if arrow_lists_pass():
        return pd.arrays.ArrowExtensionArray(names), pd.arrays.ArrowExtensionArray(values)
    return names.to_numpy(zero_copy_only=False), values.to_numpy(zero_copy_only=False)


def _with_appended(keys: pa.Array, values: pa.Array, lengths: np.ndarray, rows: np.ndarray, name: str, added) -> tuple:
    """The flat header names and values with one more at the end of each row of ``rows``, and the new lengths."""
    rows = np.asarray(rows, dtype=bool)
    flat, count = len(keys), int(rows.sum())
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    added_before = np.cumsum(rows) - rows  # in rows before each row
    new_lengths = lengths + rows
    ends = np.cumsum(new_lengths)
    order = np.empty(flat + count, dtype=np.int64)
    order[np.arange(flat) + added_before[row_of]] = np.arange(flat)
    order[ends[rows] - 1] = flat + np.arange(count)
    take = pa.array(order)
    keys = pa.concat_arrays([keys, pa.array([name] * count, keys.type)]).take(take)
    values = pa.concat_arrays([values, pa.array(list(added), values.type)]).take(take)
    return keys, values, new_lengths


def nullable_ints(values: pd.Series, dtype: str):
    """A column of ints or nulls (None, NaN, pd.NA) as a nullable integer array, without a Python call per row."""
    if values.isna().all():
        return pd.array([None] * len(values), dtype=dtype)
    if pd.api.types.is_integer_dtype(values.dtype):
        return values.astype(dtype).array
    return pd.to_numeric(values, errors="coerce").astype(dtype).array


def ipc_bytes(table: pa.Table, options: pa.ipc.IpcWriteOptions = _IPC_OPTIONS) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_table(blob) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(bytes(blob))).read_all()


def from_blob(blob) -> pd.DataFrame:
    """A chunk as an entries frame (a chunk written before the expiry and cron columns gets them null)."""
    return with_entry_columns(ipc_table(blob).to_pandas())


def delta_blob(changes: list) -> bytes:
    """An index delta (``index_cache``): (sid, IndexEntry or None) changes, and (None, (first, last)) ranges."""
    entries = [None if sid is None else entry for sid, entry in changes]
    return ipc_bytes(
        pa.table(
            [
                pa.array([sid for sid, _ in changes], pa.binary()),
                pa.array(
                    [entry[0] if sid is None else None if entry is None else entry.due_ms for sid, entry in changes],
                    pa.int64(),
                ),
                pa.array([None if e is None else e.delivery_id for e in entries], pa.string()),
                pa.array([None if e is None else e.digest for e in entries], pa.binary()),
                pa.array([entry[1] if sid is None else None for sid, entry in changes], pa.int64()),
            ],
            schema=DELTA_SCHEMA,
        )
    )


def delta_of_blob(blob) -> list:
    """The changes of ``delta_blob``, entries as plain tuples (``index_cache.stored``). A delta of entries only (an
    ingest's) is zipped from whole columns in C: a worker catching up after an ingest reads millions."""
    table = ipc_table(blob)
    if not table.column("sid").null_count and not table.column("due_ms").null_count:
        columns = table.select(["sid", "due_ms", "delivery_id", "digest"]).to_pydict()
        return list(zip(columns["sid"], zip(columns["due_ms"], columns["delivery_id"], columns["digest"])))
    columns = table.to_pydict()
    through = columns.get("through_ms") or [None] * len(columns["sid"])
    return [
        (None, (due_ms, through_ms))
        if sid is None
        else (sid, None if due_ms is None else (due_ms, delivery_id, digest))
        for sid, due_ms, delivery_id, digest, through_ms in zip(
            columns["sid"], columns["due_ms"], columns["delivery_id"], columns["digest"], through
        )
    ]
