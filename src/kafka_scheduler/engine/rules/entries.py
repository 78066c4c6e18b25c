"""Entries frames: schedules as the rules move them in bulk (one row per schedule, the columns of a chunk), their
conversions to and from ``Schedule``, and how they are cut into chunks of bounded size.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from operator import attrgetter

import numpy as np
import pandas as pd

from ...protocol import ENTRY_OVERHEAD_BYTES
from .cells import flag, headers_of, missing, optional_bytes, optional_int
from .fields import ENTRY, HEADERS, INDEX_COLUMNS, Field, fields_in
from .schedule import Cron, Schedule, WriteBack

ENTRY_FIELDS = fields_in(ENTRY)
# An entry column is the Schedule's field of its name, or with one of these prefixes the field of its part
# (``wb_topic``: ``write_back.topic``, ``cron_expr``: ``cron.expr``).
PART_PREFIXES = {"wb_": "write_back", "cron_": "cron"}


def entry_bytes(schedule: Schedule) -> int:
    """Rough stored size, to bound chunks (the decoder computes the same in Spark SQL)."""

    def header_bytes(pairs) -> int:
        return sum(len(name.encode()) + len(value or b"") for name, value in pairs)

    back = schedule.write_back
    definition = schedule.cron
    return (
        ENTRY_OVERHEAD_BYTES
        + len(schedule.key or b"")
        + len(schedule.value or b"")
        + header_bytes(schedule.headers)
        + (0 if back is None else len(back.key or b"") + header_bytes(back.headers))
        + (0 if definition is None else len(definition.expr.encode()) + len((definition.tz or "").encode()))
    )


def entries_frame(schedules: Iterable[Schedule], ids: Iterable[tuple] | None = None) -> pd.DataFrame:
    """``ids``: (sid, digest) of each schedule; None: schedules without request id. Built column by column, each
    column with its dtype (fields.py), so that frames made here and chunks read back concatenate alike."""
    schedules = list(schedules)
    if not schedules:
        return empty_entries()
    ids = list(ids) if ids is not None else [(None, None)] * len(schedules)
    parts = {"": schedules, **{prefix: [getattr(s, part) for s in schedules] for prefix, part in PART_PREFIXES.items()}}
    columns = {}
    for field in ENTRY_FIELDS:
        columns[field.name] = _typed(field, _column(field, schedules, parts, ids))
    return pd.DataFrame(columns)


def _column(field: Field, schedules: list, parts: dict, ids: list) -> list:
    name = field.name
    if name in INDEX_COLUMNS:  # ids are (sid, digest) pairs
        position = INDEX_COLUMNS.index(name)
        return [pair[position] for pair in ids]
    if name == "entry_bytes":
        return list(map(entry_bytes, schedules))
    prefix = next((p for p in PART_PREFIXES if name.startswith(p)), "")
    get = attrgetter(name[len(prefix) :])
    values = [None if part is None else get(part) for part in parts[prefix]]
    if field.type is HEADERS:
        return [None if v is None else list(v) for v in values]
    return values


def _typed(field: Field, values: list):
    """A column's values (Python values, None for null) with the dtype of its field (nullable ints as Int32/Int64);
    built from numpy, as ``pd.array`` infers the type of each value first (most of a small frame's time)."""
    if field.pandas == "object":
        return values
    if field.pandas in ("Int32", "Int64"):
        n = len(values)
        mask = np.fromiter((v is None for v in values), dtype=bool, count=n)
        data = np.fromiter((0 if v is None else v for v in values), dtype=field.pandas.lower(), count=n)
        return pd.arrays.IntegerArray(data, mask)
    return np.array(values, dtype=field.pandas)


@functools.cache
def _no_entries() -> pd.DataFrame:
    return pd.DataFrame({f.name: pd.Series(dtype=f.pandas) for f in ENTRY_FIELDS})


def empty_entries() -> pd.DataFrame:
    """An entries frame of no rows, every column of its dtype."""
    return _no_entries().copy()


def with_entry_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with every entry column: those a chunk written before them lacks are null (a flag: false)."""
    absent = [f for f in ENTRY_FIELDS if f.name not in frame.columns]
    if not absent:
        return frame
    n = len(frame)
    return frame.assign(
        **{f.name: pd.Series(_typed(f, [False if f.pandas == "bool" else None] * n), index=frame.index) for f in absent}
    )


def with_entry_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each entry column it has of its field's dtype (a frame of rows with a due time). Request frames
    come from Arrow, which holds a nullable int column as float64 (NaN for null) or as int64 (no null in the batch),
    and a due time as float64 if some request of the batch has none. Concatenated with entries frames, such columns
    leave pandas to pick a dtype among those of the frames where they are not all null (and warn that it will stop
    leaving the all-null ones out)."""
    changed = [f for f in ENTRY_FIELDS if f.name in frame.columns and str(frame[f.name].dtype) != f.pandas]
    if not changed:
        return frame
    typed = frame.copy(deep=False)  # the columns left as they are stay shared
    for f in changed:
        typed[f.name] = frame[f.name].astype(f.pandas)
    return typed


def cron_of_entry(r) -> Cron | None:
    expr = getattr(r, "cron_expr", None)
    if missing(expr):
        return None
    tz, policy = getattr(r, "cron_tz", None), getattr(r, "cron_policy", None)
    return Cron(
        expr,
        None if missing(tz) else tz,
        "replay" if missing(policy) else policy,
        optional_int(getattr(r, "cron_start_ms", None)),
        optional_int(getattr(r, "cron_end_ms", None)),
    )


@functools.lru_cache(maxsize=256)
def _row_type(columns: tuple) -> type:
    return collections.namedtuple("Row", columns, rename=True)


# Rows converted at a time by ``named_rows``: a whole frame at once held ~45 MB per 100,000 entries.
NAMED_ROWS_SLICE = 1024


def named_rows(frame: pd.DataFrame) -> Iterator[tuple]:
    """``frame.itertuples(index=False)`` without the namedtuple class it builds on every call (about 1 ms each, most
    of a small batch's rules), and with Python ints where it gives numpy ones (nullable int columns)."""
    row = _row_type(tuple(frame.columns))
    for start in range(0, len(frame), NAMED_ROWS_SLICE):
        yield from map(row._make, frame.iloc[start : start + NAMED_ROWS_SLICE].to_numpy(dtype=object).tolist())


def schedule_of_entry(r) -> Schedule:
    """A Schedule from a row (``named_rows``) of an entries frame or of the processor's request frame (a CRON_ADD's due
    time is null there: 0)."""
    wb_headers = getattr(r, "wb_headers", None)
    return Schedule(
        optional_int(r.due_ms) or 0,
        r.topic,
        optional_bytes(r.key),
        optional_bytes(r.value),
        headers_of(r.headers),
        r.delivery_id,
        partition=optional_int(getattr(r, "partition", None)),
        partition_key=optional_bytes(getattr(r, "partition_key", None)),
        write_back=None
        if missing(wb_headers)
        else WriteBack(r.wb_topic, int(r.wb_partition), optional_bytes(r.wb_key), headers_of(wb_headers)),
        history=flag(getattr(r, "history", False)),
        max_lateness_ms=optional_int(getattr(r, "max_lateness_ms", None)),
        cron=cron_of_entry(r),
    )


def schedules_of(frame: pd.DataFrame) -> list[Schedule]:
    return [schedule_of_entry(r) for r in named_rows(frame)]


def split_by_bytes(frame: pd.DataFrame, limit: int) -> list[pd.DataFrame]:
    """Consecutive slices of about ``limit`` bytes: a row goes to the slice in which it starts, so a
    slice exceeds ``limit`` by at most its last row."""
    if not len(frame):
        return []
    sizes = frame["entry_bytes"].to_numpy(dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    slice_of = starts // limit
    cuts = [0, *(np.flatnonzero(np.diff(slice_of)) + 1).tolist(), len(sizes)]
    if len(cuts) == 2:
        return [frame.reset_index(drop=True)]
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(cuts)]


def merge_small(parts: list, seal: int, merge: Callable[[tuple, tuple], tuple]) -> list:
    """Keep the unsealed parts (weight below seal/2) of a list geometric: while the newest two
    are within a factor of two of each other, merge them. Each item is then rewritten
    O(log) times before it is sealed, and at most O(log seal) parts stay unsealed."""
    while True:
        small = [p for p in parts if p[1] < seal // 2]
        if len(small) < 2 or small[-2][1] > 2 * small[-1][1]:
            return parts
        older, newer = small[-2], small[-1]
        merged = merge(older, newer)
        parts = [p for p in parts if p is not older and p is not newer] + [merged]
