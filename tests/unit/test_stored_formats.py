"""What checkpoints keep, pinned verbatim: the chunk blob's Arrow schema and its pandas metadata, the index delta's
schema, the state variables' DDL, and the digests of versions. State written by one version of the job is read by the
next: a change to any of these is a change of the checkpoint format, never a refactoring.

``stored/chunk-0.1.0.arrow`` is a chunk blob written by version 0.1.0 (``to_blob`` of ``SCHEDULES`` with ``IDS``): it
must read back as those schedules, with the dtypes a chunk written today reads back with."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
from pyspark.sql import Row

from kafka_scheduler.engine.processor.blobs import CHUNK_SCHEMA, DELTA_SCHEMA, from_blob, ipc_table, to_blob
from kafka_scheduler.engine.processor.wheel_processor import STATE_VARIABLES
from kafka_scheduler.engine.rules.buckets import BUCKET_INFO_DDL, BucketInfo
from kafka_scheduler.engine.rules.digests import cron_digest, digest, digest_of_entry
from kafka_scheduler.engine.rules.entries import entries_frame, named_rows, schedules_of
from kafka_scheduler.engine.rules.schedule import Cron, Schedule, WriteBack

STORED = Path(__file__).parent / "stored"

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

PINNED_CHUNK_SCHEMA = pa.schema(
    [
        ("due_ms", pa.int64()),
        ("topic", pa.string()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", HEADERS),
        ("delivery_id", pa.string()),
        ("entry_bytes", pa.int64()),
        ("partition", pa.int32()),
        ("partition_key", pa.binary()),
        ("wb_topic", pa.string()),
        ("wb_partition", pa.int32()),
        ("wb_key", pa.binary()),
        ("wb_headers", HEADERS),
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

# (pandas_type, numpy_type) of each chunk column in the pandas metadata every chunk carries: what makes a chunk read
# back with nullable ints as Int32/Int64 whichever way it was written.
PINNED_PANDAS_TYPES = {
    "due_ms": ("int64", "int64"),
    "topic": ("unicode", "object"),
    "key": ("bytes", "object"),
    "value": ("bytes", "object"),
    "headers": ("list[object]", "object"),
    "delivery_id": ("unicode", "object"),
    "entry_bytes": ("int64", "int64"),
    "partition": ("int32", "Int32"),
    "partition_key": ("bytes", "object"),
    "wb_topic": ("unicode", "object"),
    "wb_partition": ("int32", "Int32"),
    "wb_key": ("bytes", "object"),
    "wb_headers": ("list[object]", "object"),
    "history": ("bool", "bool"),
    "sid": ("bytes", "object"),
    "digest": ("bytes", "object"),
    "max_lateness_ms": ("int64", "Int64"),
    "cron_expr": ("unicode", "object"),
    "cron_tz": ("unicode", "object"),
    "cron_policy": ("unicode", "object"),
    "cron_start_ms": ("int64", "Int64"),
    "cron_end_ms": ("int64", "Int64"),
}

PINNED_DELTA_SCHEMA = pa.schema(
    [
        ("sid", pa.binary()),
        ("due_ms", pa.int64()),
        ("delivery_id", pa.string()),
        ("digest", pa.binary()),
        ("through_ms", pa.int64()),
    ]
)

PINNED_STATE_VARIABLES = {
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
    "paused": ("paused", "sid binary", "data binary"),
    "levels": ("levels", "fine_mark long, coarse array<long>, listed array<long>"),
}

SCHEDULES = [
    Schedule(1_900_000_000_000, "out", b"k", b"v", (("h", b"1"), ("empty", None)), "in-0-1"),
    Schedule(1_900_000_000_500, "out", None, None, (), "in-0-2", max_lateness_ms=600_000),
    Schedule(
        1_900_000_001_000,
        "elsewhere",
        b"key",
        b"value",
        (("a", b"x"),),
        "kar-3-7",
        partition=2,
        partition_key=b"pk",
        write_back=WriteBack("kar", 3, b"key", (("x-scheduler-source-offset", b"7"),)),
        history=True,
    ),
    Schedule(
        1_900_000_005_000,
        "out",
        b"c",
        b"tick",
        (),
        "in-1-9@1900000005000",
        max_lateness_ms=5000,
        cron=Cron("* * * * * */5", "Europe/Paris", "skip", 1_899_999_999_000, 1_900_000_100_000),
    ),
    Schedule(1_900_000_010_000, "out", b"k", b"v", (), "in-1-10@1900000010000", cron=Cron("*/5 * * * *")),
]
IDS = [
    (None, None),
    (b"id:in/b", b"\x01" * 16),
    (b"id:kar/key", b"\x02" * 16),
    (b"cron:in/c", b"\x03" * 16),
    (b"cron:in/d", b"\x04" * 16),
]
# (digest, cron_digest) of each of SCHEDULES, as version 0.1.0 computed them.
PINNED_DIGESTS = [
    ("039d137c6d5016af58637480d4c12f46", "a90bcebe6b421e48c55359c1fcf23c9e"),
    ("725e214d1dc282af4f7aec970a144f32", "68af0df52dba9825c0ea01aaf907f31c"),
    ("ce29760622182cb6a24c5d5090fb793f", "5361deb2ade2a2bef34ff5579eefa053"),
    ("2eebdecd0c49aaba099964be5a3055af", "50a0948febe8db54730720ee42019218"),
    ("5ee5d0beb1ae44ad807bcb2c50972551", "204b16f6f2002e514df4d9a13e2eaad2"),
]


def pandas_types(schema: pa.Schema) -> dict:
    columns = json.loads(schema.metadata[b"pandas"])["columns"]
    return {c["name"]: (c["pandas_type"], c["numpy_type"]) for c in columns}


def test_the_chunk_schema_and_its_pandas_metadata_are_those_checkpoints_hold():
    assert CHUNK_SCHEMA == PINNED_CHUNK_SCHEMA
    written = ipc_table(to_blob(entries_frame(SCHEDULES, IDS))).schema
    assert written.remove_metadata() == PINNED_CHUNK_SCHEMA
    assert pandas_types(written) == PINNED_PANDAS_TYPES


def test_the_index_delta_schema_is_the_one_checkpoints_hold():
    assert DELTA_SCHEMA == PINNED_DELTA_SCHEMA


def test_the_state_variables_are_declared_with_the_ddl_checkpoints_hold():
    assert {name: tuple(spec) for name, spec in STATE_VARIABLES.items()} == PINNED_STATE_VARIABLES


def test_a_chunk_written_by_version_0_1_0_reads_back_as_one_written_today():
    stored = (STORED / "chunk-0.1.0.arrow").read_bytes()
    old = from_blob(stored)
    assert schedules_of(old) == SCHEDULES
    assert list(zip(old["sid"], old["digest"])) == IDS
    today = from_blob(to_blob(entries_frame(SCHEDULES, IDS)))
    pd.testing.assert_frame_equal(old, today)
    assert pandas_types(ipc_table(stored).schema) == PINNED_PANDAS_TYPES


def test_digests_are_those_stored_in_checkpoints():
    frame = entries_frame(SCHEDULES, IDS)
    assert [(digest(s).hex(), cron_digest(s).hex()) for s in SCHEDULES] == PINNED_DIGESTS
    assert [digest_of_entry(r).hex() for r in named_rows(frame)] == [d for d, _ in PINNED_DIGESTS]


def test_a_bucket_info_is_the_state_row_spark_hands_over():
    assert PINNED_STATE_VARIABLES["buckets"][2] == BUCKET_INFO_DDL
    info = BucketInfo(3, 5_000, 4, [(0, 4096), (2, 17)], [(3, 2)], [(1, 900)], "run-1", 4_999)
    assert info.to_row() == (3, 5_000, 4, [(0, 4096), (2, 17)], [(3, 2)], [(1, 900)], "run-1", 4_999)
    row = Row(
        created_seq=3,
        timer_ms=5_000,
        next_n=4,
        chunks=[Row(n=0, bytes=4096), Row(n=2, bytes=17)],
        strikes=[Row(n=3, count=2)],
        fires=[Row(seq=1, rule_ms=900)],
        prep_run="run-1",
        prep_through=4_999,
    )
    assert BucketInfo.from_row(row) == info
    # A value written before the prepare mark or with empty lists: nulls read as empty.
    old = Row(
        created_seq=1, timer_ms=2, next_n=0, chunks=None, strikes=None, fires=None, prep_run=None, prep_through=-1
    )
    assert BucketInfo.from_row(old) == BucketInfo(1, 2)
