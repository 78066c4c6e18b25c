"""The state step's input: the requests of each Arrow batch packed per shard (run by ``mapInArrow`` on the executors,
before the shuffle), read back as one frame per handler call, and put in log order."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from .blobs import ipc_bytes, ipc_table

# The state step's input: the requests of each Arrow batch packed per shard into one Arrow IPC blob, by a vectorised
# Python step (mapInArrow) before the shuffle. Given one row per request, PySpark's state worker turns each Arrow batch
# into pandas, walks it row by row to group rows by key and builds a frame of them again, a third of ingest's
# Python time; a blob per shard is read back into one frame in C++ (docs/measurements.md).
PACKED_REQUESTS = "shard int, requests binary"

# Uncompressed: a packed blob lives for one shuffle, which compresses it.
_PACK_OPTIONS = pa.ipc.IpcWriteOptions()


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
                    [ipc_bytes(table.slice(start, end - start), _PACK_OPTIONS) for start, end in zip(starts, ends)],
                    pa.binary(),
                ),
            ],
            names=["shard", "requests"],
        )


def unpacked(frames: Iterable[pd.DataFrame]) -> pd.DataFrame | None:
    """The requests of a handler call's packed rows, as one frame (None: none; a blob is never empty)."""
    tables = [ipc_table(blob) for frame in frames for blob in frame["requests"]]
    return pa.concat_tables(tables).to_pandas() if tables else None


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
