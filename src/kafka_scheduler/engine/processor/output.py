"""The frames the state step emits (``OUTPUT_SCHEMA`` of engine/contract.py): deliveries, rejections, outcome counts,
armed timers and withdrawals, merged into few frames per handler call."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from ...delivery_ids import request_of
from ...protocol import CRON_FIRE_TIMESTAMP, REJECTION_REASON
from ..contract import (
    BATCH_TIME,
    KIND_DELIVER,
    KIND_EXPIRED,
    KIND_OUTCOME,
    KIND_REJECT,
    KIND_TIMER,
    KIND_WITHDRAW,
    OUTCOME_REJECTED,
    OUTPUT_COLUMNS,
    outcome_key,
)
from ..rules.batch import expired_mask
from ..rules.cells import header_pairs, missing
from ..rules.fields import FIELDS
from ..rules.partitioning import partition_hash
from ..rules.rejection_classes import reason_class
from ..rules.rejections import rejection_headers
from . import arrow_lists
from .blobs import flags, header_lists, nullable_ints

# The header lists emitted here pass PySpark's conversion to Arrow without a Python call a row (arrow_lists.py).
arrow_lists.install()


def records_frame(kind: str, topic, key, value, headers, due_ms, **extras) -> pd.DataFrame:
    """``headers``: None, or (names, values) as ``header_lists`` gives them."""
    names, values = (None, None) if headers is None else headers
    columns = {
        "kind": kind,
        "topic": topic,
        "key": key,
        "value": value,
        "header_names": names,
        "header_values": values,
        "due_ms": due_ms,
        **extras,
    }
    rows = len(topic)
    # A missing column is a list of None: a scalar None broadcast by pandas becomes NaN, which Spark cannot read
    # as an array or a string.
    return pd.DataFrame(
        {name: [None] * rows if columns.get(name) is None else columns[name] for name in OUTPUT_COLUMNS},
        columns=OUTPUT_COLUMNS,
    )


def outcomes_frame(counts: Counter) -> pd.DataFrame:
    """Outcome rows; a key is an outcome name (or Outcome), or a tuple of it and its labels (metrics.outcome_key)."""

    def name(key) -> str:
        parts = key if isinstance(key, tuple) else (key,)
        return outcome_key(*(str(getattr(p, "value", p)) for p in parts))

    # Every cell given: a column pandas fills by itself holds NaN, which Spark cannot read as an array or a string.
    return pd.DataFrame(
        [
            {**dict.fromkeys(OUTPUT_COLUMNS), "kind": KIND_OUTCOME, "topic": name(k), "n": n}
            for k, n in counts.items()
            if n
        ],
        columns=OUTPUT_COLUMNS,
    )


def rejection_counts(frame: pd.DataFrame) -> Counter:
    """(rejected, input topic, reason class) -> n of rejection rows (``src_topic``, ``headers``)."""

    def reason(headers):
        return next((v for k, v in header_pairs(headers) if k == REJECTION_REASON), None)

    return Counter(
        (OUTCOME_REJECTED, str(topic), reason_class(reason(headers)))
        for topic, headers in zip(frame["src_topic"], frame["headers"])
    )


def _header_dicts(cell) -> list:
    return [{"key": k, "value": v} for k, v in header_pairs(cell)]


def has_values(entries: pd.DataFrame, column: str) -> bool:
    return column in entries and bool(entries[column].notna().any())


def deliveries_frame(entries: pd.DataFrame, now_ms: int | None = None) -> pd.DataFrame:
    """Delivery rows; with ``now_ms``, those due after it are marked prepared (for the timed writer). A cron's firing
    carries ``x-scheduler-cron-fire-timestamp`` (its instant in Unix seconds, as Kaspr writes it); rows marked
    ``expired`` (``batch.mark_expired``) are of kind ``expired``: the sink rejects them."""
    crons = entries["cron_expr"].notna().to_numpy() if "cron_expr" in entries else np.zeros(len(entries), bool)
    instants = entries["due_ms"].to_numpy()[crons] // 1000
    names, values = header_lists(entries["headers"], (crons, CRON_FIRE_TIMESTAMP, [b"%d" % s for s in instants]))
    extras = {"delivery_id": entries["delivery_id"].to_numpy()}
    if "sid" in entries:
        extras["sid"] = entries["sid"].to_numpy()
    if (
        has_values(entries, "wb_headers")
        or has_values(entries, "partition_key")
        or has_values(entries, "partition")
        or ("history" in entries and flags(entries["history"]).any())
    ):
        # Only dialects other than native get here: the frames of native deliveries skip these columns.
        extras |= {
            "partition": nullable_ints(entries["partition"], "Int32"),
            "partition_hash": pd.array(
                [None if missing(k) else partition_hash(bytes(k)) for k in entries["partition_key"]], dtype="Int32"
            ),
            "wb_topic": entries["wb_topic"].to_numpy(),
            "wb_partition": nullable_ints(entries["wb_partition"], "Int32"),
            "wb_key": entries["wb_key"].to_numpy(),
            "wb_headers": [None if missing(h) else _header_dicts(h) for h in entries["wb_headers"]],
            "history": flags(entries["history"]),
        }
    if now_ms is not None:
        extras["prepared"] = (entries["due_ms"].to_numpy() > now_ms).tolist()
    if has_values(entries, "max_lateness_ms"):
        extras["max_lateness_ms"] = nullable_ints(entries["max_lateness_ms"], "Int64")
    expired = expired_mask(entries)
    frame = records_frame(
        KIND_DELIVER,
        entries["topic"].to_numpy(),
        entries["key"].to_numpy(),
        entries["value"].to_numpy(),
        (names, values),
        entries["due_ms"].to_numpy(),
        **extras,
    )
    if expired.any():
        frame.loc[expired, "kind"] = KIND_EXPIRED
    return frame


def rejections_frame(rejected: pd.DataFrame, rejections_topic: str) -> pd.DataFrame:
    """CRON_ADDs the rules refused (``BatchResult.rejected``) as rejection records, as the decoder writes them: the
    request's key, value and headers as read, the reason and the request's source."""

    def headers(raw, reason, delivery_id):
        return header_pairs(raw) + rejection_headers([reason], *request_of(delivery_id))

    return records_frame(
        KIND_REJECT,
        [rejections_topic] * len(rejected),
        rejected["key"].to_numpy(),
        rejected["value"].to_numpy(),
        header_lists(
            [headers(*row) for row in zip(rejected["raw_headers"], rejected["reason"], rejected["delivery_id"])]
        ),
        None,
    )


def batch_time_frame(now_ms: int) -> pd.DataFrame:
    """The processing time the state's rules ran at (BATCH_TIME): each handler call reports it."""
    return pd.DataFrame(
        [{**dict.fromkeys(OUTPUT_COLUMNS), "kind": KIND_OUTCOME, "topic": BATCH_TIME, "n": now_ms, "due_ms": now_ms}],
        columns=OUTPUT_COLUMNS,
    )


def timer_frame(instants: list) -> pd.DataFrame:
    return records_frame(KIND_TIMER, [None] * len(instants), None, None, None, [int(t) for t in instants])


def withdraw_frame(delivery_ids: list) -> pd.DataFrame:
    return records_frame(
        KIND_WITHDRAW, [None] * len(delivery_ids), [d.encode() for d in delivery_ids], None, None, None
    )


# Spark converts each frame a handler yields to Arrow on its own, at a fixed cost (~2 ms on this machine) that
# dwarfs the rows of a usual handler call (a timer row, the batch time, the index size, a few deliveries): a call's
# small frames go out merged, up to this many rows at a time.
MERGED_ROWS = 10_000


def merged(frames: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``frames`` in as few frames as ``MERGED_ROWS`` allows; a large one (a slice of a herd) passes at once, so a
    call that emits millions holds no more of them than before. Empty frames are left out."""
    held: list[pd.DataFrame] = []
    rows = 0
    for frame in frames:
        if not len(frame):
            continue
        if len(frame) > MERGED_ROWS:
            yield frame
            continue
        held.append(frame)
        rows += len(frame)
        if rows >= MERGED_ROWS:
            yield _concat(held)
            held, rows = [], 0
    if held:
        yield _concat(held)


# The header lists' dtypes where they pass PySpark's conversion as Arrow (blobs.header_lists): merged frames keep them
# so, or a herd's chunks a little smaller than MERGED_ROWS would go back to a Python list a row.
ARROW_LISTS = (
    {name: pd.ArrowDtype(FIELDS[name].arrow) for name in ("header_names", "header_values")}
    if arrow_lists.arrow_lists_pass()
    else {}
)

# Each output column's dtype in the frames a call merges: the field table's, nullable (a row of one kind lacks the
# columns of the others).
OUTPUT_DTYPES = {name: str(ARROW_LISTS.get(name, FIELDS[name].type.nullable_pandas)) for name in OUTPUT_COLUMNS}


def with_output_dtypes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with each column of its OUTPUT_DTYPES dtype: built by kind, frames hold a column all null as objects
    and the same column elsewhere as ints or bools; concatenated so, they would leave pandas to pick the dtype among
    those of the frames where it is not null (and warn that it will stop leaving the all-null ones out)."""
    changed = {name: dtype for name, dtype in OUTPUT_DTYPES.items() if str(frame[name].dtype) != dtype}
    if not changed:
        return frame
    typed = frame.copy(deep=False)  # the columns left as they are stay shared
    for name, dtype in changed.items():
        column = frame[name]
        if name in ARROW_LISTS:  # lists of any form, or None
            arrow = pa.array(column.to_numpy(dtype=object), type=ARROW_LISTS[name].pyarrow_dtype, from_pandas=True)
            typed[name] = pd.arrays.ArrowExtensionArray(arrow)
        else:
            typed[name] = column.astype(dtype)
    return typed


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    return pd.concat([with_output_dtypes(frame) for frame in frames], ignore_index=True)
