"""The field table (engine/rules/fields.py) against the forms it defines: each field's Arrow type, pandas dtype and
Spark DDL type agree, and the lists and schemas derived from it are those the job used before it existed (the decode's
columns, the dialects' optional columns, the processor's output schema, the sink's record columns)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DataType

from kafka_scheduler.dialects.common import HEADER_TYPE, NORMALIZED_COLUMNS, OPTIONAL_COLUMNS
from kafka_scheduler.engine.contract import HEADERS_TYPE, OUTPUT_SCHEMA
from kafka_scheduler.engine.driver.record_sink import RECORD_COLUMNS
from kafka_scheduler.engine.processor.blobs import CHUNK_SCHEMA, from_blob, to_blob
from kafka_scheduler.engine.rules.entries import empty_entries, entries_frame
from kafka_scheduler.engine.rules.fields import ENTRY, ENTRY_COLUMNS, FIELDS, HEADERS_DDL, fields_in
from kafka_scheduler.engine.rules.schedule import Cron, Schedule, WriteBack
from kafka_scheduler.engine.spark.ddl import spark_type

# The lists as they were written out by hand before the field table.
PINNED_NORMALIZED_COLUMNS = (
    "sid",
    "kind",
    "action",
    "due_ms",
    "topic",
    "key",
    "value",
    "headers",
    "delivery_id",
    "src_topic",
    "src_partition",
    "src_offset",
    "src_ts_ms",
    "entry_bytes",
    "completes",
    "partition",
    "partition_key",
    "wb_topic",
    "wb_partition",
    "wb_key",
    "wb_headers",
    "history",
    "max_lateness_ms",
    "cron_expr",
    "cron_tz",
    "cron_policy",
    "cron_start_ms",
    "cron_end_ms",
    "raw_headers",
)
PINNED_OPTIONAL_COLUMNS = {
    "_completes": "string",
    "_partition": "int",
    "_partition_key": "binary",
    "_wb_headers": "array<struct<key:string,value:binary>>",
    "_history": "boolean",
    "_max_lateness_ms": "long",
    "_cron_expr": "string",
    "_cron_tz": "string",
    "_cron_policy": "string",
    "_cron_start_ms": "long",
    "_cron_end_ms": "long",
    "_raw_headers": "array<struct<key:string,value:binary>>",
}
PINNED_OUTPUT_SCHEMA = (
    "struct<kind:string,topic:string,key:binary,value:binary,header_names:array<string>,header_values:array<binary>,"
    "delivery_id:string,due_ms:bigint,n:bigint,partition:int,partition_hash:int,wb_topic:string,wb_partition:int,"
    "wb_key:binary,wb_headers:array<struct<key:string,value:binary>>,history:boolean,prepared:boolean,"
    "max_lateness_ms:bigint,sid:binary>"
)
PINNED_RECORD_COLUMNS = {
    "kind",
    "topic",
    "partition",
    "key",
    "value",
    "headers",
    "due_ms",
    "prepared",
    "delivery_id",
    "max_lateness_ms",
    "sid",
}

# The pandas dtype a column of each Arrow type is held in (nullable: where it may be null).
PANDAS_OF_ARROW = {
    pa.int64(): {"int64", "Int64"},
    pa.int32(): {"int32", "Int32"},
    pa.bool_(): {"bool", "boolean"},
}


def same_arrow_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Equal, whatever the name of a list's item field (Arrow's ``item``, PySpark's ``element``)."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_arrow_type(a.value_type, b.value_type)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return [f.name for f in a] == [f.name for f in b] and all(same_arrow_type(x.type, y.type) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", list(FIELDS))
def test_each_fields_arrow_type_is_the_one_spark_gives_its_ddl_type(name):
    field = FIELDS[name]
    assert same_arrow_type(to_arrow_type(spark_type(field.ddl)), field.arrow), field


@pytest.mark.parametrize("name", list(FIELDS))
def test_each_fields_pandas_dtype_holds_its_arrow_type(name):
    field = FIELDS[name]
    assert field.pandas in PANDAS_OF_ARROW.get(field.arrow, {"object"}), field
    assert field.type.nullable_pandas in PANDAS_OF_ARROW.get(field.arrow, {"object"}), field


def test_the_ddl_types_parse_as_spark_parses_them(spark):
    for ddl in {field.ddl for field in FIELDS.values()}:
        assert spark_type(ddl) == DataType.fromDDL(ddl), ddl


def test_the_lists_derived_from_the_table_are_those_written_out_before_it():
    assert NORMALIZED_COLUMNS == PINNED_NORMALIZED_COLUMNS
    assert OPTIONAL_COLUMNS == PINNED_OPTIONAL_COLUMNS
    assert OUTPUT_SCHEMA.simpleString() == PINNED_OUTPUT_SCHEMA
    assert set(RECORD_COLUMNS) == PINNED_RECORD_COLUMNS
    assert HEADER_TYPE == HEADERS_DDL
    assert spark_type(HEADERS_DDL) == HEADERS_TYPE
    assert [(f.name, f.type) for f in CHUNK_SCHEMA] == [(f.name, f.arrow) for f in fields_in(ENTRY)]


def test_every_entries_frame_has_the_tables_dtypes():
    schedules = [
        Schedule(5, "out", b"k", b"v", (("h", b"1"),), "in-0-1"),
        Schedule(
            7,
            "out",
            None,
            None,
            (),
            "kar-0-2",
            partition=1,
            write_back=WriteBack("kar", 0, None, ()),
            history=True,
            max_lateness_ms=10,
            cron=Cron("* * * * *", None, "skip", 0, 100),
        ),
    ]
    expected = {f.name: f.pandas for f in fields_in(ENTRY)}
    for frame in (
        entries_frame(schedules),
        entries_frame(schedules[:1]),  # every nullable column null
        entries_frame([]),
        empty_entries(),
        from_blob(to_blob(entries_frame(schedules))),
    ):
        assert list(frame.columns) == ENTRY_COLUMNS
        assert {name: str(dtype) for name, dtype in frame.dtypes.items()} == expected
