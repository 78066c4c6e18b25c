"""The Spark side of the bulk layout (``wheel.py``): a pandas ``StatefulProcessor`` keyed by shard.

Requests arrive as pandas frames (Arrow batches); chunks of schedules are stored as
Arrow IPC blobs (lz4), so the add and fire paths move schedules in bulk and make state
calls per bucket. The id index lives in the worker's memory (``index_cache``): a handler call
makes a constant few state calls for it, whatever the number of requests with ids.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from ..dialects.common import KIND_REJECT, header
from ..protocol import (
    CRON_FIRE_TIMESTAMP,
    DELIVERY_ID,
    REJECTION_REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    request_of,
)
from .batch_summary import BATCH_TIME, DELIVERED_AT_ONCE, INDEX_ENTRIES_PREFIX, SKIPPED_FIRINGS, outcome_key
from .index_cache import IndexCache, IndexEntry, IndexToken, cache_for
from .partitioning import partition_hash
from .rejection_classes import reason_class
from .schedule import Action, Request, is_internal
from .wheel import (
    DEFAULT_CRON_MIN_INTERVAL_MS,
    ENTRY_COLUMNS,
    INDEX_COLUMNS,
    NULLABLE_INT_COLUMNS,
    BucketInfo,
    apply_requests,
    expired_mask,
    fire,
    header_pairs,
    missing,
    named_rows,
    schedule_of_entry,
    with_entry_columns,
)

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

# What the processor emits: records to write (deliver, reject) and per-outcome counts (outcome). Headers leave
# Python as two lists of primitives, names and values, and a delivery's id as a column of its own: ``record_rows``
# zips them into (key, value) structs in the JVM. As a list of structs they cost each row a dict per header built
# by the processor and another by PySpark's conversion to Arrow, most of a herd's Python time (docs/measurements.md).
OUTPUT_SCHEMA = StructType(
    [
        StructField("kind", StringType()),
        StructField("topic", StringType()),  # destination topic; for outcome rows, the outcome name
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("header_names", ArrayType(StringType())),
        StructField("header_values", ArrayType(BinaryType())),
        StructField("delivery_id", StringType()),  # deliveries only: record_rows adds it as the last header
        StructField("due_ms", LongType()),
        StructField("n", LongType()),
        # deliveries only: the explicit partition, or the partitioner hash of a partition key (the sink takes it
        # modulo the destination's partition count); the write-back to send and whether to copy to history
        StructField("partition", IntegerType()),
        StructField("partition_hash", IntegerType()),
        StructField("wb_topic", StringType()),
        StructField("wb_partition", IntegerType()),
        StructField("wb_key", BinaryType()),
        StructField("wb_headers", HEADERS_TYPE),
        StructField("history", BooleanType()),
        # deliveries only: emitted ahead of its due time, for the driver's timed writer (see wheel.apply_requests)
        StructField("prepared", BooleanType()),
        # deliveries (and expired ones): later than due + this, the sink or the timed writer rejects it as expired
        StructField("max_lateness_ms", LongType()),
        # deliveries only: the schedule's id in the state, by which a CANCEL read early finds it (early_cancels.py)
        StructField("sid", BinaryType()),
    ]
)
OUTPUT_COLUMNS = OUTPUT_SCHEMA.names
_HEADER_PARTS = ["header_names", "header_values", "delivery_id"]


def record_rows(output: DataFrame) -> DataFrame:
    """The processor's rows as the sink reads them: ``headers`` in place of the names, values and delivery id, the
    delivery's id the last header (after a cron firing's fire timestamp, as the processor emitted it before)."""
    pairs = F.arrays_zip("header_names", "header_values").cast(HEADERS_TYPE)
    with_id = F.concat(
        F.coalesce(pairs, F.array().cast(HEADERS_TYPE)), F.array(header(DELIVERY_ID, F.encode("delivery_id", "UTF-8")))
    )
    headers = F.when(F.col("delivery_id").isNotNull(), with_id).otherwise(pairs).alias("headers")
    columns = [name for name in OUTPUT_COLUMNS if name not in _HEADER_PARTS]
    at = columns.index("value") + 1
    return output.select(*columns[:at], headers, *columns[at:])


KIND_DELIVER = "deliver"
KIND_EXPIRED = "expired"  # a delivery written later than its max lateness would allow: the sink rejects it
KIND_OUTCOME = "outcome"
OUTCOME_REJECTED = "rejected"

REJECTIONS_SHARD = -1
# Rows besides deliveries, rejections and outcomes: a timer instant the shard armed (``due_ms``), for the
# driver's wake-ups; a delivery id (``key``) the timed writer must drop; a tick record (input only).
KIND_TIMER = "timer"
KIND_WITHDRAW = "withdraw"
KIND_TICK = "tick"

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
CHUNK_SCHEMA = pa.schema(
    [
        ("due_ms", pa.int64()),
        ("topic", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", _HEADER_TYPE),
        ("delivery_id", pa.string()),
        ("entry_bytes", pa.int64()),
        ("partition", pa.int32()),
        ("partition_key", pa.binary()),
        ("wb_topic", pa.string()),
        ("wb_partition", pa.int32()),
        ("wb_key", pa.binary()),
        ("wb_headers", _HEADER_TYPE),
        ("history", pa.bool_()),
        ("sid", pa.binary()),
        ("digest", pa.binary()),
        ("max_lateness_ms", pa.int64()),
        ("cron_expr", pa.string()),
        ("cron_tz", pa.string()),
        ("cron_policy", pa.string()),
        ("cron_start_ms", pa.int64()),
        ("cron_end_ms", pa.int64()),
    ]
)
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


def shard_column(shards: int) -> Column:
    """The grouping key: a stable hash of the schedule id; rejections share one key of their own."""
    return F.when(F.col("kind") == KIND_REJECT, F.lit(REJECTIONS_SHARD)).otherwise(
        F.pmod(F.xxhash64("sid"), F.lit(shards)).cast("int")
    )


def with_shards(requests, shards: int, ticks_topic: str):
    """Each request row with its shard; a report tick read from ``ticks_topic`` goes to every shard (each
    reports its armed timers), a wake-up tick to none (reading it was its whole purpose)."""
    is_tick = F.col("src_topic") == ticks_topic
    report = is_tick & (F.col("value") == F.lit(b"report"))
    rows = requests.filter(~is_tick | report).withColumn(
        "kind", F.when(is_tick, F.lit(KIND_TICK)).otherwise(F.col("kind"))
    )
    return rows.withColumn(
        "shard",
        F.explode(F.when(is_tick, F.sequence(F.lit(0), F.lit(shards - 1))).otherwise(F.array(shard_column(shards)))),
    )


# The state step's input: the requests of each Arrow batch packed per shard into one Arrow IPC blob, by a vectorised
# Python step (mapInArrow) before the shuffle. Given one row per request, PySpark's state worker turns each Arrow batch
# into pandas, walks it row by row to group rows by key and builds a frame of them again, a third of ingest's
# Python time; a blob per shard is read back into one frame in C++ (docs/measurements.md).
PACKED_REQUESTS = "shard int, requests binary"
# Uncompressed: a packed blob lives for one shuffle, which compresses it.
_PACK_OPTIONS = pa.ipc.IpcWriteOptions()


def packed_by_shard(rows: DataFrame) -> DataFrame:
    """``rows`` (with their ``shard``) as (shard, requests blob) rows, a blob per shard per Arrow batch."""
    return rows.mapInArrow(pack_by_shard, PACKED_REQUESTS)


def pack_by_shard(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        if not batch.num_rows:
            continue
        table = pa.Table.from_batches([batch]).sort_by("shard")
        shards = table.column("shard").to_numpy()
        starts = np.flatnonzero(np.r_[True, shards[1:] != shards[:-1]])
        ends = np.r_[starts[1:], len(shards)]
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(shards[starts], pa.int32()),
                pa.array(
                    [_ipc(table.slice(start, end - start), _PACK_OPTIONS) for start, end in zip(starts, ends)],
                    pa.binary(),
                ),
            ],
            names=["shard", "requests"],
        )


def unpacked(frames: Iterable[pd.DataFrame]) -> pd.DataFrame | None:
    """The requests of a handler call's packed rows, as one frame (None: none; a blob is never empty)."""
    tables = [_table(blob) for frame in frames for blob in frame["requests"]]
    return pa.concat_tables(tables).to_pandas() if tables else None


_INT_TYPES = {"partition": "Int32", "wb_partition": "Int32"}


def _pandas_types(field: pa.Field) -> tuple[str, str]:
    if field.name in NULLABLE_INT_COLUMNS:
        numpy_type = _INT_TYPES.get(field.name, "Int64")
        return numpy_type.lower(), numpy_type
    if pa.types.is_integer(field.type) or pa.types.is_boolean(field.type):
        return str(field.type), str(field.type)
    return (
        "unicode" if pa.types.is_string(field.type) else "bytes" if pa.types.is_binary(field.type) else "list[object]"
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
                    for f in CHUNK_SCHEMA
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
    for field in CHUNK_SCHEMA:
        name, values = field.name, entries[field.name]
        if name == "headers":
            array = header_array(values)
        elif name == "wb_headers":
            array = header_array(values, keep_nulls=True)
        elif name in NULLABLE_INT_COLUMNS:
            array = pa.array(_nullable_ints(values, _INT_TYPES.get(name, "Int64")), type=field.type)
        elif name == "history":
            array = pa.array(flags(values), type=field.type)
        elif pa.types.is_integer(field.type):  # due_ms, entry_bytes: never null
            array = pa.array(values.to_numpy(dtype=np.int64), type=field.type)
        else:  # strings and bytes: None, NaN or pd.NA is null (from_pandas)
            array = pa.array(values.to_numpy(dtype=object), type=field.type, from_pandas=True)
        arrays.append(array)
    return _ipc(pa.Table.from_arrays(arrays, schema=_CHUNK_SCHEMA_WITH_PANDAS))


def flags(values: pd.Series) -> np.ndarray:
    """``wheel.flag`` of every cell, without a Python call per row: a missing one is False."""
    if values.dtype == bool:
        return values.to_numpy()
    present = values.notna().to_numpy()
    result = np.zeros(len(values), dtype=bool)
    result[present] = values[present].astype(bool).to_numpy()
    return result


def _present(entries: pd.DataFrame, column: str) -> bool:
    return column in entries and bool(entries[column].notna().any())


def header_array(cells, keep_nulls: bool = False) -> pa.ListArray:
    """A headers column as Arrow: in one call where every cell has one form (the tuples of a Schedule, or the dicts
    Arrow hands back), row by row where a frame mixes them. A missing cell is an empty list, or null with
    ``keep_nulls``."""
    try:
        array = pa.array(cells, type=_HEADER_TYPE, from_pandas=True)
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        array = pa.array([None if missing(h) else header_pairs(h) for h in cells], type=_HEADER_TYPE)
    if array.null_count and not keep_nulls:
        return pa.ListArray.from_arrays(array.offsets, array.values)  # offsets carry no nulls: empty lists
    return array


def header_lists(cells) -> tuple[np.ndarray, np.ndarray]:
    """A headers column as the processor emits it (OUTPUT_SCHEMA): a list of names and a list of values per row,
    None for a row without headers (PySpark copies every list it is given, one Python call each)."""
    array = header_array(cells)
    offsets = array.offsets
    names = pa.ListArray.from_arrays(offsets, array.values.field("key")).to_numpy(zero_copy_only=False)
    values = pa.ListArray.from_arrays(offsets, array.values.field("value")).to_numpy(zero_copy_only=False)
    none = np.diff(offsets.to_numpy()) == 0
    names[none] = None
    values[none] = None
    return names, values


def _nullable_ints(values: pd.Series, dtype: str):
    """A column of ints or nulls (None, NaN, pd.NA) as a nullable integer array, without a Python call per row."""
    if values.isna().all():
        return pd.array([None] * len(values), dtype=dtype)
    if pd.api.types.is_integer_dtype(values.dtype):
        return values.astype(dtype).array
    return pd.to_numeric(values, errors="coerce").astype(dtype).array


def _ipc(table: pa.Table, options: pa.ipc.IpcWriteOptions = _IPC_OPTIONS) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _table(blob) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(bytes(blob))).read_all()


def from_blob(blob) -> pd.DataFrame:
    """A chunk as an entries frame (a chunk written before the expiry and cron columns gets them null)."""
    return with_entry_columns(_table(blob).to_pandas())


def delta_blob(changes: list) -> bytes:
    """An index delta (``index_cache``): (sid, IndexEntry or None) changes, and (None, (first, last)) ranges."""
    entries = [None if sid is None else entry for sid, entry in changes]
    return _ipc(
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
    columns = _table(blob).to_pydict()
    through = columns.get("through_ms") or [None] * len(columns["sid"])
    return [
        (None, (due_ms, through_ms))
        if sid is None
        else (sid, None if due_ms is None else IndexEntry(due_ms, delivery_id, digest))
        for sid, due_ms, delivery_id, digest, through_ms in zip(
            columns["sid"], columns["due_ms"], columns["delivery_id"], columns["digest"], through
        )
    ]


def log_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Kafka order: offsets ascending within a partition; partitions interleaved by timestamp.

    Each row is keyed by the running maximum timestamp of its partition (in offset order),
    which never decreases within a partition, so sorting on it keeps every partition's order.
    """
    frame = frame.sort_values(["src_topic", "src_partition", "src_offset"], kind="stable")
    running = frame.groupby(["src_topic", "src_partition"], sort=False)["src_ts_ms"].cummax()
    return frame.assign(_order=running).sort_values(
        ["_order", "src_topic", "src_partition", "src_offset"], kind="stable"
    )


def _pairs(cells) -> list:
    return [(int(c[0]), int(c[1])) for c in cells or ()]


def _bucket_info(value) -> BucketInfo:
    return BucketInfo(
        int(value[0]),
        int(value[1]),
        int(value[2]),
        _pairs(value[3]),
        _pairs(value[4]),
        _pairs(value[5]),
        value[6] or "",
        int(value[7]),
    )


class MapStateShardStore:
    """``ShardStore`` over the processor's state variables and the shard's timers."""

    def __init__(self, processor: WheelProcessor):
        self.p = processor
        self.shard: int | None = None
        self.cache: IndexCache | None = None

    def use_shard(self, shard: int) -> None:
        """The processor (and this store) serve every shard of a partition in turn."""
        self.shard, self.cache = shard, cache_for(shard)

    def next_seq(self):
        value = self.p.seq.get()
        seq = (int(value[0]) if value is not None else 0) + 1
        self.p.seq.update((seq,))
        return seq

    def index_token_get(self):
        value = self.p.index_token.get()
        if value is None:
            return None
        return IndexToken(
            int(value[0]), int(value[1]), [int(n) for n in value[2]], [int(n) for n in value[3]], int(value[4])
        )

    def index_token_put(self, token):
        self.p.index_token.update((token.version, token.base, list(token.nonces), list(token.sizes), token.entries))

    def delta_get(self, version, part):
        return delta_of_blob(self.p.deltas.getValue((version, part))[0])

    def delta_put(self, version, part, changes):
        self.p.deltas.updateValue((version, part), (delta_blob(changes),))

    def delta_remove(self, version, part):
        self.p.deltas.removeKey((version, part))

    def bucket_items(self):
        return [(int(key[0]), _bucket_info(value)) for key, value in self.p.buckets.iterator()]

    def bucket_keys(self):
        return [int(key[0]) for key in self.p.buckets]

    def chunk_index(self, bucket, n):
        value = self.p.chunks.getValue((bucket, n))
        if value is None:
            return pd.DataFrame(columns=["sid", "due_ms", "delivery_id", "digest"])
        return _table(value[0]).select(["sid", "due_ms", "delivery_id", "digest"]).to_pandas()

    def index_size(self) -> tuple[int, int]:
        """(version, entries) of the shard's index as state has them (no sync of the cache)."""
        token = self.index_token_get() or IndexToken()
        return token.version, token.entries

    def bucket_get(self, bucket):
        value = self.p.buckets.getValue((bucket,))
        return None if value is None else _bucket_info(value)

    def bucket_put(self, bucket, info):
        self.p.buckets.updateValue(
            (bucket,),
            (
                info.created_seq,
                info.timer_ms,
                info.next_n,
                info.chunks,
                info.strikes,
                info.fires,
                info.prep_run,
                info.prep_through,
            ),
        )

    def bucket_remove(self, bucket):
        self.p.buckets.removeKey((bucket,))

    def chunk_get(self, bucket, n):
        value = self.p.chunks.getValue((bucket, n))
        return from_blob(value[0]) if value is not None else pd.DataFrame(columns=ENTRY_COLUMNS)

    def chunk_put(self, bucket, n, entries):
        self.p.chunks.updateValue((bucket, n), (to_blob(entries),))

    def chunk_remove(self, bucket, n):
        self.p.chunks.removeKey((bucket, n))

    def strikes_get(self, bucket, n):
        value = self.p.strikes.getValue((bucket, n))
        return list(value[0] or ()) if value is not None else []

    def strikes_put(self, bucket, n, delivery_ids):
        self.p.strikes.updateValue((bucket, n), (list(delivery_ids),))

    def strikes_remove(self, bucket, n):
        self.p.strikes.removeKey((bucket, n))

    def armed_get(self, timer_ms):
        value = self.p.armed.getValue((timer_ms,))
        return [int(b) for b in value[0] or ()] if value is not None else []

    def armed_put(self, timer_ms, buckets):
        self.p.armed.updateValue((timer_ms,), (list(buckets),))

    def armed_remove(self, timer_ms):
        self.p.armed.removeKey((timer_ms,))

    def register_timer(self, timer_ms):
        self.p.handle.registerTimer(timer_ms)
        self.p.new_timers.append(timer_ms)

    def paused_get(self, sid):
        value = self.p.paused.getValue((bytes(sid),))
        return None if value is None else from_blob(value[0])

    def paused_put(self, sid, entry):
        self.p.paused.updateValue((bytes(sid),), (to_blob(entry),))

    def paused_remove(self, sid):
        self.p.paused.removeKey((bytes(sid),))

    def paused_items(self):
        return [(bytes(key[0]), from_blob(value[0])) for key, value in self.p.paused.iterator()]

    def levels_get(self):
        value = self.p.levels.get()
        return (
            None
            if value is None
            else (int(value[0]), [int(k) for k in value[1] or ()], [int(k) for k in value[2] or ()])
        )

    def levels_put(self, fine_mark, coarse, listed):
        self.p.levels.update((fine_mark, list(coarse), list(listed)))


def _records(kind: str, topic, key, value, headers, due_ms, **extras) -> pd.DataFrame:
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


def _outcomes(counts: Counter) -> pd.DataFrame:
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


def deliveries_frame(entries: pd.DataFrame, now_ms: int | None = None) -> pd.DataFrame:
    """Delivery rows; with ``now_ms``, those due after it are marked prepared (for the timed writer). A cron's firing
    carries ``x-scheduler-cron-fire-timestamp`` (its instant in Unix seconds, as Kaspr writes it); rows marked
    ``expired`` (wheel.mark_expired) are of kind ``expired``: the sink rejects them."""
    crons = entries["cron_expr"].notna().to_numpy() if "cron_expr" in entries else np.zeros(len(entries), bool)
    names, values = header_lists(entries["headers"])
    for row in np.flatnonzero(crons):
        names[row] = [*(names[row] if names[row] is not None else ()), CRON_FIRE_TIMESTAMP]
        values[row] = [
            *(values[row] if values[row] is not None else ()),
            str(int(entries["due_ms"].iat[row]) // 1000).encode(),
        ]
    extras = {"delivery_id": entries["delivery_id"].to_numpy()}
    if "sid" in entries:
        extras["sid"] = entries["sid"].to_numpy()
    if (
        _present(entries, "wb_headers")
        or _present(entries, "partition_key")
        or _present(entries, "partition")
        or ("history" in entries and flags(entries["history"]).any())
    ):
        # Only dialects other than native get here: the frames of native deliveries skip these columns.
        extras |= {
            "partition": _nullable_ints(entries["partition"], "Int32"),
            "partition_hash": pd.array(
                [None if missing(k) else partition_hash(bytes(k)) for k in entries["partition_key"]], dtype="Int32"
            ),
            "wb_topic": entries["wb_topic"].to_numpy(),
            "wb_partition": _nullable_ints(entries["wb_partition"], "Int32"),
            "wb_key": entries["wb_key"].to_numpy(),
            "wb_headers": [None if missing(h) else _header_dicts(h) for h in entries["wb_headers"]],
            "history": flags(entries["history"]),
        }
    if now_ms is not None:
        extras["prepared"] = (entries["due_ms"].to_numpy() > now_ms).tolist()
    if _present(entries, "max_lateness_ms"):
        extras["max_lateness_ms"] = _nullable_ints(entries["max_lateness_ms"], "Int64")
    expired = expired_mask(entries)
    frame = _records(
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
    """CRON_ADDs the rules refused (wheel.BatchResult.rejected) as rejection records, as the decoder writes them: the
    request's key, value and headers as read, the reason and the request's source."""

    def headers(raw, reason, delivery_id):
        topic, partition, offset = request_of(delivery_id)
        return header_pairs(raw) + [
            (REJECTION_REASON, reason.encode()),
            (SOURCE_TOPIC, topic.encode()),
            (SOURCE_PARTITION, partition.encode()),
            (SOURCE_OFFSET, offset.encode()),
        ]

    return _records(
        KIND_REJECT,
        [rejections_topic] * len(rejected),
        rejected["key"].to_numpy(),
        rejected["value"].to_numpy(),
        header_lists(
            [headers(*row) for row in zip(rejected["raw_headers"], rejected["reason"], rejected["delivery_id"])]
        ),
        None,
    )


def _batch_time_row(now_ms: int) -> pd.DataFrame:
    """The processing time the state's rules ran at (BATCH_TIME): each handler call reports it."""
    return pd.DataFrame(
        [{**dict.fromkeys(OUTPUT_COLUMNS), "kind": KIND_OUTCOME, "topic": BATCH_TIME, "n": now_ms, "due_ms": now_ms}],
        columns=OUTPUT_COLUMNS,
    )


def _timer_rows(instants: list) -> pd.DataFrame:
    return _records(KIND_TIMER, [None] * len(instants), None, None, None, [int(t) for t in instants])


def _withdraw_rows(delivery_ids: list) -> pd.DataFrame:
    return _records(KIND_WITHDRAW, [None] * len(delivery_ids), [d.encode() for d in delivery_ids], None, None, None)


# Spark converts each frame a handler yields to Arrow on its own, at a fixed cost (~2 ms on this machine) that
# dwarfs the rows of a usual handler call (a timer row, the batch time, the index size, a few deliveries): a call's
# small frames go out merged, up to this many rows at a time.
MERGED_ROWS = 10_000


def merged(frames: Iterable[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``frames`` in as few frames as ``MERGED_ROWS`` allows; a large one (a slice of a herd) passes at once, so a
    call that emits millions holds no more of them than before."""
    held: list[pd.DataFrame] = []
    rows = 0
    for frame in frames:
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


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    if len(frames) == 1:
        return frames[0]
    with warnings.catch_warnings():
        # pandas warns that a column all null in some frames may get another dtype in a later release: the Arrow
        # conversion casts every column to OUTPUT_SCHEMA, whatever dtype pandas picks.
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(frames, ignore_index=True)


# The state variables, as WheelProcessor attributes: (state name, value schema) for a value state, (state name, key
# schema, value schema) for a map state, in DDL.
STATE_VARIABLES = {
    "seq": ("seq", "seq long"),
    "index_token": ("index_token", "version long, base long, nonces array<long>, sizes array<long>, entries long"),
    "deltas": ("index_deltas", "version long, part int", "data binary"),
    "buckets": (
        "buckets",
        "bucket long",
        "created_seq long, timer_ms long, next_n int, chunks array<struct<n:long,bytes:long>>, "
        "strikes array<struct<n:long,count:long>>, fires array<struct<seq:long,rule_ms:long>>, "
        "prep_run string, prep_through long",
    ),
    "chunks": ("chunks", "bucket long, n int", "data binary"),
    "strikes": ("strikes", "bucket long, n int", "delivery_ids array<string>"),
    "armed": ("armed", "timer_ms long", "buckets array<long>"),
    # Paused crons: the definition (a one-row chunk blob), keyed by the cron's sid (added with issue 19).
    "paused": ("paused", "sid binary", "data binary"),
    # Where the buckets are among the levels (wheel.Levels): one value per shard, read once per call that files or
    # locates a schedule. A checkpoint without it gets it from its bucket keys (added for spread dues).
    "levels": ("levels", "fine_mark long, coarse array<long>, listed array<long>"),
}


def parsed_state_schemas() -> dict:
    """DDL -> StructType of every state schema, parsed on the driver once. Given DDL, a task's init asks the JVM to
    parse each schema (a round trip and a parse per schema, in every task of every batch)."""
    return {ddl: DataType.fromDDL(ddl) for _, *schemas in STATE_VARIABLES.values() for ddl in schemas}


class WheelProcessor(StatefulProcessor):
    """``window_ms``: schedules due up to this far after the batch time are prepared (emitted for the
    driver's timed writer, kept in state until retired); ``run`` names the driver process whose writer
    holds what this run prepares (wheel.BucketInfo's prepare mark); ``started_ms``: when it started (a skip cron's
    firing due before was missed); ``rejections_topic``: where CRON_ADDs the rules refuse go; ``parsed_schemas``:
    ``parsed_state_schemas()``, made on the driver (without it, each task's init has the JVM parse each DDL)."""

    def __init__(
        self,
        window_ms: int = 0,
        run: str = "",
        started_ms: int | None = None,
        cron_min_interval_ms: int = DEFAULT_CRON_MIN_INTERVAL_MS,
        rejections_topic: str = "",
        parsed_schemas: dict | None = None,
    ):
        self.parsed_schemas = parsed_schemas or {}
        self.window_ms = window_ms
        self.run = run
        self.started_ms = started_ms
        self.cron_min_interval_ms = cron_min_interval_ms
        self.rejections_topic = rejections_topic

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        for attribute, (name, *schemas) in STATE_VARIABLES.items():
            schemas = [self.parsed_schemas.get(ddl, ddl) for ddl in schemas]
            setattr(
                self,
                attribute,
                handle.getValueState(name, *schemas) if len(schemas) == 1 else handle.getMapState(name, *schemas),
            )
        self.store = MapStateShardStore(self)
        self.new_timers: list[int] = []

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        yield from merged(self._input_frames(key, unpacked(rows), timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        yield from merged(self._timer_frames(key, timerValues, expiredTimerInfo))

    def _input_frames(self, key, frame: pd.DataFrame | None, timerValues) -> Iterator[pd.DataFrame]:
        self.new_timers = []
        if frame is None:
            return
        ticks = frame["kind"] == KIND_TICK
        if ticks.any():
            armed = list(self.handle.listTimers())
            if armed:
                yield _timer_rows(armed)
            frame = frame[~ticks].reset_index(drop=True)
            if not len(frame):
                yield _batch_time_row(timerValues.getCurrentProcessingTimeInMs())
                return
        if int(key[0]) == REJECTIONS_SHARD:
            yield _records(
                KIND_REJECT,
                frame["topic"].to_numpy(),
                frame["key"].to_numpy(),
                frame["value"].to_numpy(),
                header_lists(frame["headers"]),
                None,
            )
            yield _outcomes(rejection_counts(frame))
            return
        shard = int(key[0])
        self.store.use_shard(shard)
        anonymous_mask = frame["sid"].map(is_internal).astype(bool)
        base_columns = [c for c in ENTRY_COLUMNS if c not in INDEX_COLUMNS]
        anonymous = (
            frame.loc[anonymous_mask, base_columns + ["src_topic"]].assign(sid=None, digest=None).reset_index(drop=True)
        )
        client = frame[~anonymous_mask]
        # An ADD or REPLACE (or CRON_ADD) whose id no other request of the batch names needs no log order: filed
        # in bulk unless its id has a pending version (or cron).
        unique = ~client["sid"].duplicated(keep=False)
        alone = (unique & client["action"].isin([Action.ADD.value, Action.REPLACE.value])).to_numpy()
        cron_alone = (unique & (client["action"] == Action.CRON_ADD.value)).to_numpy()
        keyed = (
            client.loc[alone, base_columns + ["sid", "action", "src_topic"]].assign(digest=None).reset_index(drop=True)
        )
        cron_adds = (
            client.loc[cron_alone, base_columns + ["sid", "src_topic", "raw_headers"]]
            .assign(digest=None)
            .reset_index(drop=True)
        )
        requests = []
        for row in named_rows(log_order(client[~alone & ~cron_alone])):
            action = Action(row.action)
            schedule = schedule_of_entry(row) if action in (Action.ADD, Action.REPLACE, Action.CRON_ADD) else None
            completes = None if missing(row.completes) else row.completes
            requests.append(
                (
                    bytes(row.sid),
                    Request(
                        action,
                        schedule,
                        completes,
                        raw_headers=None if missing(row.raw_headers) else row.raw_headers,
                        activation=row.delivery_id,
                    ),
                )
            )
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        result = apply_requests(
            self.store,
            requests,
            now_ms,
            anonymous,
            self.window_ms,
            self.run,
            keyed,
            cron_adds,
            started_ms=self.started_ms,
            cron_min_interval_ms=self.cron_min_interval_ms,
        )
        for emitted in result.emitted:
            if len(emitted):
                yield deliveries_frame(emitted, now_ms)
        for rejected in result.rejected:
            yield rejections_frame(rejected, self.rejections_topic)
        if result.withdrawn:
            yield _withdraw_rows(result.withdrawn)
        if self.new_timers:
            yield _timer_rows(self.new_timers)
        yield _outcomes(
            result.by_topic
            + Counter({(DELIVERED_AT_ONCE, t): n for t, n in result.at_once.items()})
            + Counter({SKIPPED_FIRINGS: result.skipped})
        )
        yield from self._reports(shard, now_ms)

    def _timer_frames(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        self.new_timers = []
        shard = int(key[0])
        self.store.use_shard(shard)
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        counts = Counter()
        for due in fire(
            self.store,
            expiredTimerInfo.getExpiryTimeInMs(),
            now_ms,
            self.window_ms,
            self.run,
            started_ms=self.started_ms,
            counts=counts,
        ):
            if len(due):
                yield deliveries_frame(due, now_ms)
        if self.new_timers:
            yield _timer_rows(self.new_timers)
        if counts:
            yield _outcomes(Counter({SKIPPED_FIRINGS: counts["skipped"]}))
        yield from self._reports(shard, now_ms)

    def _reports(self, shard: int, now_ms: int) -> Iterator[pd.DataFrame]:
        """Contract with the sink: after each call, the batch's processing time (BATCH_TIME), and the entries of the
        shard's index (zero too), as outcome rows. The index size is read from the token (one state call): the cache
        may not have been synced in this call. ``due_ms`` carries the index version, so the sink can keep the last
        of a shard's reports in a batch."""
        yield _batch_time_row(now_ms)
        version, entries = self.store.index_size()
        if entries >= 0:  # unknown until the next call that uses the index rebuilds it
            yield pd.DataFrame(
                [
                    {
                        **dict.fromkeys(OUTPUT_COLUMNS),
                        "kind": KIND_OUTCOME,
                        "topic": f"{INDEX_ENTRIES_PREFIX}{shard}",
                        "n": entries,
                        "due_ms": version,
                    }
                ],
                columns=OUTPUT_COLUMNS,
            )

    def close(self) -> None:
        pass
