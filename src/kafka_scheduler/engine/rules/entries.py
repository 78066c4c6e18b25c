"""Entries frames: schedules as the rules move them in bulk (one row per schedule, the columns of a chunk), their
conversions to and from ``Schedule``, and how they are cut into chunks of bounded size.
"""

from __future__ import annotations

import collections
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator

import numpy as np
import pandas as pd

from ...protocol import ENTRY_OVERHEAD_BYTES
from .cells import flag, headers_of, missing, optional_bytes, optional_int
from .schedule import Cron, Schedule, WriteBack

ENTRY_COLUMNS = [
    "due_ms",
    "topic",
    "key",
    "value",
    "headers",
    "delivery_id",
    "entry_bytes",
    # what some dialects add (null for native requests): see schedule.Schedule
    "partition",
    "partition_key",
    "wb_topic",
    "wb_partition",
    "wb_key",
    "wb_headers",
    "history",
    # the client id and digest of the version (null without request id): rebuild the index
    "sid",
    "digest",
    # expiry (null: none), and a cron's definition (null for one-shots): see schedule.Cron
    "max_lateness_ms",
    "cron_expr",
    "cron_tz",
    "cron_policy",
    "cron_start_ms",
    "cron_end_ms",
]
INDEX_COLUMNS = ["sid", "digest"]
CRON_COLUMNS = ["cron_expr", "cron_tz", "cron_policy", "cron_start_ms", "cron_end_ms"]
NULLABLE_INT_COLUMNS = ("partition", "wb_partition", "max_lateness_ms", "cron_start_ms", "cron_end_ms")


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
    """``ids``: (sid, digest) of each schedule; None: schedules without request id."""
    rows = []
    for s, (sid, version_digest) in zip(schedules, ids if ids is not None else itertools.repeat((None, None))):
        back, definition = s.write_back, s.cron
        rows.append(
            (
                s.due_ms,
                s.topic,
                s.key,
                s.value,
                list(s.headers),
                s.delivery_id,
                entry_bytes(s),
                s.partition,
                s.partition_key,
                *(
                    (None, None, None, None)
                    if back is None
                    else (back.topic, back.partition, back.key, list(back.headers))
                ),
                s.history,
                sid,
                version_digest,
                s.max_lateness_ms,
                *(
                    (None,) * 5
                    if definition is None
                    else (definition.expr, definition.tz, definition.policy, definition.start_ms, definition.end_ms)
                ),
            )
        )
    if not rows:
        return _NO_ENTRIES.copy()
    frame = pd.DataFrame(rows, columns=ENTRY_COLUMNS)
    # Column by column, and only those pandas made numeric: astype with a mapping concatenates every column again
    # (2.3 of the 3.6 ms a call took; a batch of the model tests makes several).
    for column in NULLABLE_INT_COLUMNS:
        if frame[column].dtype != object:
            frame[column] = frame[column].astype(object)
    return frame


_NO_ENTRIES = pd.DataFrame([], columns=ENTRY_COLUMNS)


def with_entry_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with every entry column: those a chunk written before them lacks are null."""
    absent = [c for c in ENTRY_COLUMNS if c not in frame.columns]
    if not absent:
        return frame
    return frame.assign(**{c: pd.Series([None] * len(frame), index=frame.index, dtype=object) for c in absent})


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
