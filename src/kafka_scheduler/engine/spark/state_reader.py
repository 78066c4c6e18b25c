"""The wheel's state as a checkpoint holds it, read with Spark's state data source (format ``statestore``) for the
operator's tools (``inspect``, ``list``, the status page), whether the job runs or not. The one reader of the state
layout outside the processor: the tools see buckets as spans of due times, pending schedules as entries frames less
what their strikes took out, and paused crons; they know no state variable, key or level.

The layout (engine/rules/store.py): per shard, ``chunks`` (bucket, n) -> an Arrow blob of schedules, ``strikes``
(bucket, n) -> delivery ids struck out of the bucket's chunks since they were written (replaced or cancelled), and
``paused`` (cron sid) -> a paused cron. A bucket holds one second of due times, or a coarse span of 64ᴸ seconds; the
spans of one shard's buckets never overlap, those of two shards may.

Each read of a state variable is a Spark job whose fixed cost (scheduling it, opening each partition's RocksDB
state) dwarfs a small state's rows, so the reads are few: ``buckets`` is one job (the chunks' keys and sizes, no
data; and the paused crons when asked), ``pending`` one job per group of chunks of at most ``group_bytes`` (their data
and their buckets' strikes together), fetched as the caller goes, so a caller that stops early reads no more.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial

import pandas as pd

from ..processor.blobs import from_blob
from ..rules.buckets import BUCKET_MS, COARSE_BASE, COARSE_MIN, LEVEL_FANOUT, LEVEL_SLOTS, key_range

# Chunk bytes a job of ``pending`` brings to the driver at most (a chunk larger than that comes alone): the first
# group small, so that a page of a small state is one quick job, the later ones larger, so that a large read is
# few jobs.
FIRST_GROUP_BYTES = 4 * 1024 * 1024
GROUP_BYTES = 32 * 1024 * 1024
GROUP_BUCKETS = 4096  # and at most this many buckets (each is a value of the job's filter)


@dataclass(frozen=True)
class Bucket:
    """A bucket of one shard: the due times it may hold, [start_ms, end_ms), and its chunks as (n, bytes)."""

    shard: int
    key: int
    start_ms: int
    end_ms: int
    chunks: tuple[tuple[int, int], ...] = ()

    @property
    def bytes(self) -> int:
        return sum(size for _, size in self.chunks)


def bucket_span_ms(key: int) -> tuple[int, int]:
    """[start, end) in ms of the due times bucket ``key`` holds."""
    return key_range(key)


def time_order(buckets: Iterable[Bucket]) -> list[Bucket]:
    """Buckets by the first due time they may hold: once the buckets before one are read, every schedule due before
    its start has been seen."""
    return sorted(buckets, key=lambda b: (b.start_ms, b.end_ms, b.shard, b.key))


def span_sql(column: str) -> tuple[str, str]:
    """The first and last second (both included) of the due times of a bucket key column, as two Spark SQL
    expressions: ``bucket_span_ms`` in seconds."""
    offset = f"({column} - {COARSE_BASE})"
    width = f"CAST(pow({LEVEL_FANOUT}, pmod({offset}, {LEVEL_SLOTS})) AS BIGINT)"
    index = f"({offset} div {LEVEL_SLOTS})"
    return (
        f"CASE WHEN {column} < {COARSE_MIN} THEN {column} ELSE {index} * {width} END",
        f"CASE WHEN {column} < {COARSE_MIN} THEN {column} ELSE ({index} + 1) * {width} - 1 END",
    )


# A tool's session (inspect, list) starts, reads a few state variables and stops: HotSpot's optimizing compiler (C2)
# and the parallel collector's threads cost such a short-lived JVM more CPU than they save it, and so does Spark's
# generated code (Java source per plan, compiled by Janino, then by the JIT) for the few thousand rows of a state's
# keys and chunks (docs/measurements.md, "list on a small state").
TOOL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
TOOL_SQL_SETTINGS = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


def tool_session(app_id: str, checkpoint_dir: str):
    """A local Spark session for a tool that reads a checkpoint (``inspect``, ``list``), not the job's."""
    import os

    from ...config import Config
    from .session import build_session

    # spark-class's launcher is a JVM of its own, started before the driver's.
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", TOOL_JVM_OPTIONS)
    # A tool has no urgent reads of its own for the JVM to yield to (cpu_priority.py).
    tool_config = Config(master="local[1]", app_id=app_id, checkpoint_dir=checkpoint_dir, engine_niceness=0)
    spark = build_session(tool_config, TOOL_JVM_OPTIONS)
    for key, value in TOOL_SQL_SETTINGS.items():
        spark.conf.set(key, value)
    # A state store opened outside a streaming query reports to a coordinator that only the query manager starts:
    # without it, each partition's store warned that the coordinator was not available.
    spark.streams  # noqa: B018
    return spark


def shard_of(sid: bytes, shards: int):
    """The shard the job keeps ``sid`` in, as a Spark column (engine/spark/query.shard_column, computed by Spark
    itself), for ``CheckpointState``'s ``shard``: no job of its own."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(F.lit(bytearray(sid))), F.lit(shards)).cast("int")


def state_variable(spark, checkpoint_dir: str, name: str, batch: int | None = None):
    """One state variable of the job's checkpoint (as of ``batch``; None: the newest committed), as a DataFrame."""
    reader = spark.read.format("statestore").option("stateVarName", name)
    if batch is not None:
        reader = reader.option("batchId", batch)
    return reader.load(checkpoint_dir)


class CheckpointState:
    """The state of one committed batch (``batch``; None: the newest), only ``shard``'s if given (a number, or a Spark
    column: ``shard_of``)."""

    def __init__(
        self,
        spark,
        checkpoint_dir: str,
        batch: int | None = None,
        shard=None,
        first_group_bytes: int = FIRST_GROUP_BYTES,
        group_bytes: int = GROUP_BYTES,
    ):
        self.spark, self.checkpoint_dir, self.batch, self.shard = spark, checkpoint_dir, batch, shard
        self.first_group_bytes, self.group_bytes = first_group_bytes, group_bytes
        self._frames: dict[str, object] = {}
        self.jobs = 0  # Spark jobs run (reads of the state), for the tools' timings

    def _variable(self, name: str):
        """A state variable's DataFrame, loaded once (a load resolves the checkpoint's state schema)."""
        if name not in self._frames:
            from pyspark.sql import functions as F

            frame = state_variable(self.spark, self.checkpoint_dir, name, self.batch)
            self._frames[name] = frame if self.shard is None else frame.where(F.col("key.shard") == self.shard)
        return self._frames[name]

    def _paused_rows(self):
        """The ``paused`` state variable's rows as (shard, data), or None for a checkpoint written before paused
        crons existed."""
        from pyspark.sql import functions as F
        from pyspark.sql.utils import AnalysisException

        try:
            return self._variable("paused").select(
                F.col("key.shard").alias("shard"), F.col("user_map_value.data").alias("data")
            )
        except AnalysisException:
            return None

    def buckets(
        self, from_ms: int | None = None, before_ms: int | None = None, with_paused: bool = False
    ) -> tuple[list[Bucket], list[pd.DataFrame]]:
        """The buckets that may hold schedules due in [from_ms, before_ms) (None: open), in time order, with their
        chunks' sizes; and, ``with_paused``, the paused crons' frames (else []). One Spark job."""
        from pyspark.sql import functions as F

        first, last = (F.expr(e) for e in span_sql("user_map_key.bucket"))
        chunks = self._variable("chunks")
        if from_ms is not None:
            chunks = chunks.where(last >= from_ms // BUCKET_MS)
        if before_ms is not None:
            chunks = chunks.where(first <= (before_ms - 1) // BUCKET_MS)
        rows = chunks.select(
            F.col("key.shard").alias("shard"),
            F.col("user_map_key.bucket").alias("bucket"),
            F.col("user_map_key.n").cast("long").alias("n"),
            F.octet_length("user_map_value.data").cast("long").alias("bytes"),
            F.lit(None).cast("binary").alias("data"),
        )
        paused = self._paused_rows() if with_paused else None
        if paused is not None:
            rows = rows.unionByName(
                paused.select(
                    "shard",
                    F.lit(None).cast("long").alias("bucket"),
                    F.lit(None).cast("long").alias("n"),
                    F.lit(None).cast("long").alias("bytes"),
                    "data",
                )
            )
        self.jobs += 1
        chunks_of: dict[tuple[int, int], list] = {}
        paused_frames = []
        for row in rows.collect():
            if row["bucket"] is None:
                paused_frames.append(from_blob(row["data"]))
            else:
                chunks_of.setdefault((row["shard"], row["bucket"]), []).append((row["n"], row["bytes"]))
        found = time_order(
            Bucket(shard, key, *bucket_span_ms(key), tuple(sorted(chunks)))
            for (shard, key), chunks in chunks_of.items()
        )
        return found, paused_frames

    def paused(self) -> list[pd.DataFrame]:
        """Frames of the paused crons (few): the chunk columns, ``due_ms`` where a replay would resume,
        ``delivery_id`` the activation the cron was paused in. One Spark job."""
        rows = self._paused_rows()
        if rows is None:
            return []
        self.jobs += 1
        return [from_blob(row["data"]) for row in rows.collect()]

    def pending(self, buckets: Iterable[Bucket]) -> Iterator[tuple[Bucket, pd.DataFrame]]:
        """The pending schedules of ``buckets``, a chunk at a time in the order given (each chunk's rows less the
        ids struck out of its bucket): a Spark job per group of chunks of at most ``group_bytes``, run as the caller
        gets to it."""
        limit = self.first_group_bytes
        group: list[tuple[Bucket, int]] = []
        size, in_group = 0, 0  # bytes and buckets of the group
        seen: set[tuple[int, int]] = set()
        struck: dict[tuple[int, int], set] = {}
        for bucket in buckets:
            for i, (n, nbytes) in enumerate(bucket.chunks):
                if group and (size + nbytes > limit or (i == 0 and in_group >= GROUP_BUCKETS)):
                    yield from self._read(group, seen, struck)
                    group, size, in_group, limit = [], 0, 0, self.group_bytes
                if i == 0 or not group:
                    in_group += 1
                group.append((bucket, n))
                size += nbytes
        if group:
            yield from self._read(group, seen, struck)

    def _read(self, group: list[tuple[Bucket, int]], seen: set, struck: dict) -> Iterator[tuple[Bucket, pd.DataFrame]]:
        """One job: the data of the group's chunks, and the strikes of its buckets not read before."""
        from pyspark.sql import functions as F

        chunk_names = sorted({f"{b.shard}:{b.key}:{n}" for b, n in group})
        new = sorted({(b.shard, b.key) for b, _ in group} - seen)
        chunks = (
            self._variable("chunks")
            .where(
                F.concat_ws(
                    ":", *(F.col(c).cast("string") for c in ("key.shard", "user_map_key.bucket", "user_map_key.n"))
                ).isin(chunk_names)
            )
            .select(
                F.col("key.shard").alias("shard"),
                F.col("user_map_key.bucket").alias("bucket"),
                F.col("user_map_key.n").cast("long").alias("n"),
                F.col("user_map_value.data").alias("data"),
                F.lit(None).cast("array<string>").alias("ids"),
            )
        )
        if new:
            strikes = (
                self._variable("strikes")
                .where(
                    F.concat_ws(":", *(F.col(c).cast("string") for c in ("key.shard", "user_map_key.bucket"))).isin(
                        [f"{shard}:{key}" for shard, key in new]
                    )
                )
                .select(
                    F.col("key.shard").alias("shard"),
                    F.col("user_map_key.bucket").alias("bucket"),
                    F.lit(None).cast("long").alias("n"),
                    F.lit(None).cast("binary").alias("data"),
                    F.col("user_map_value.delivery_ids").alias("ids"),
                )
            )
            chunks = chunks.unionByName(strikes)
        self.jobs += 1
        data: dict[tuple[int, int, int], bytes] = {}
        for row in chunks.collect():
            if row["data"] is None:
                struck.setdefault((row["shard"], row["bucket"]), set()).update(row["ids"] or ())
            else:
                data[(row["shard"], row["bucket"], row["n"])] = row["data"]
        seen.update(new)
        for bucket, n in group:
            blob = data.pop((bucket.shard, bucket.key, n), None)
            if blob is None:  # listed, then gone: not in this batch's state (cannot happen within one batch)
                continue
            frame = from_blob(blob)
            gone = struck.get((bucket.shard, bucket.key))
            if gone:
                frame = frame[~frame["delivery_id"].isin(gone)]
            yield bucket, frame

    def all_pending(self) -> Iterator[pd.DataFrame]:
        """Every pending schedule, a chunk at a time (frames with rows), in groups of bounded size."""
        buckets, _ = self.buckets()
        for _, frame in self.pending(buckets):
            if len(frame):
                yield frame

    def fold_pending(self, fold: Callable[[Iterator[pd.DataFrame]], str]) -> list[str]:
        """``fold`` run on the executors over each partition's pending schedules (entries frames less their strikes);
        its results. A count reads every chunk of the state: brought to the driver it would hold the state's chunks
        in the driver's heap (a soak's count ran the job's 1 GB heap out), which a few numbers per partition do
        not."""
        from pyspark.sql import functions as F

        struck = (
            self._variable("strikes")
            .select(
                F.col("key.shard").alias("shard"),
                F.col("user_map_key.bucket").alias("bucket"),
                F.col("user_map_value.delivery_ids").alias("ids"),
            )
            .groupBy("shard", "bucket")
            .agg(F.flatten(F.collect_list("ids")).alias("struck"))
        )
        chunks = self._variable("chunks").select(
            F.col("key.shard").alias("shard"),
            F.col("user_map_key.bucket").alias("bucket"),
            F.col("user_map_value.data").alias("data"),
        )
        # Broadcast: the strikes are few beside the chunks, which then are not shuffled.
        self.jobs += 1
        rows = (
            chunks.join(F.broadcast(struck), ["shard", "bucket"], "left")
            .select("data", "struck")
            .mapInPandas(partial(_fold_partition, fold), "result string")
            .collect()
        )
        return [row["result"] for row in rows]


def _unstruck(data: bytes, struck) -> pd.DataFrame:
    frame = from_blob(data)
    if struck is not None and len(struck):
        frame = frame[~frame["delivery_id"].isin(list(struck))]
    return frame


def _fold_partition(fold: Callable[[Iterator[pd.DataFrame]], str], batches: Iterator[pd.DataFrame]):
    def frames() -> Iterator[pd.DataFrame]:
        for batch in batches:
            for data, struck in zip(batch["data"], batch["struck"]):
                frame = _unstruck(data, struck)
                if len(frame):
                    yield frame

    yield pd.DataFrame({"result": [fold(frames())]})
