"""The Sky dialect with Avro values: binary Avro, no schema registry, no magic byte.

The writer schema is the contract's ``AvroSchedule``; records written with the older schema (without
``headers``) decode too: the current schema is tried first, the older one second. A value that neither
decodes, or that is longer than the schedule it holds, is rejected: a truncated current record could
otherwise pass for an older one, its headers lost. (The length is compared with the schedule encoded
again, so the rare valid encodings that are not the canonical one, like a map written in several
blocks or with negative block counts, are rejected too.) The headers map comes out in Spark's map order (Avro maps are
unordered; a name written twice keeps its last value). ``from_avro``/``to_avro`` need the spark-avro
jar (fetched by scripts/setup.sh with the Kafka connector).
"""

from __future__ import annotations

import json

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro, to_avro

from ..protocol import SKY_AVRO_FIELDS, SKY_AVRO_SCHEMA
from . import sky
from .common import DecodeSettings, bound, first_reason, no_headers, quoted

WRITER_SCHEMA = json.dumps(SKY_AVRO_SCHEMA)
OLDER_SCHEMA = json.dumps({**SKY_AVRO_SCHEMA, "fields": list(SKY_AVRO_FIELDS)})

# PERMISSIVE: a value that does not decode gives a struct of nulls (never an error); every field is
# required by both schemas, so a null ``time`` means "did not decode".
_PERMISSIVE = {"mode": "PERMISSIVE"}

# Avro's own bounds on the lengths a value declares, as JVM system properties (read once, when Avro first
# decodes). Avro allocates a string, bytes or map as large as declared before reading it; its defaults allow
# 2 GB, so a value of a few bytes claiming a 2 GB topic made the JVM die of OutOfMemoryError, and the job with
# it (PERMISSIVE catches exceptions, not errors). Beyond these a value is a malformed schedule: 16 MiB is twice
# the largest record the project's broker takes, and a million headers do not fit in one record anyway.
JVM_LIMITS = {
    "org.apache.avro.limits.string.maxLength": 16 * 2**20,
    "org.apache.avro.limits.bytes.maxLength": 16 * 2**20,
    "org.apache.avro.limits.collectionItems.maxLength": 1_000_000,
}


def java_options() -> str:
    """``JVM_LIMITS`` as JVM options, for ``spark.driver/executor.extraJavaOptions``."""
    return " ".join(f"-D{name}={value}" for name, value in JVM_LIMITS.items())


def _schedule(parsed: Column, schema: str, headers: Column) -> Column:
    """A decoded schedule (or null when ``parsed`` did not decode), as ``request_columns`` reads it."""
    bad_names = F.filter(headers, lambda h: ~F.is_valid_utf8(h["key"]))
    return F.when(
        parsed["time"].isNotNull(),
        F.struct(
            parsed["time"].alias("time"),
            F.make_valid_utf8(parsed["topic"]).alias("topic"),
            parsed["key"].alias("key"),
            parsed["value"].alias("value"),
            headers.alias("headers"),
            F.make_valid_utf8(F.get(bad_names, 0)["key"]).alias("bad_header_name"),
            # Encoded again, a schedule is as long as the value when its decode used every byte of the value.
            F.length(to_avro(parsed, schema)).alias("encoded_bytes"),
        ),
    )


def parsed_columns(settings: DecodeSettings) -> dict[str, Column]:
    """The schedule in the value: decoded with the current schema, else with the older one (each
    decode runs once: the lambdas bind their result)."""
    value = F.col("value")

    def older(parsed: Column) -> Column:
        return _schedule(parsed, OLDER_SCHEMA, no_headers())

    def current(parsed: Column) -> Column:
        return F.coalesce(
            _schedule(parsed, WRITER_SCHEMA, F.map_entries(parsed["headers"])),
            bound(from_avro(value, OLDER_SCHEMA, _PERMISSIVE), older),
        )

    return {
        "_sky_avro_headers": sky.header_texts(),
        "_sky_avro": F.when(value.isNotNull(), bound(from_avro(value, WRITER_SCHEMA, _PERMISSIVE), current)),
    }


def request_columns(settings: DecodeSettings) -> dict[str, Column]:
    schedule = F.col("_sky_avro")  # null: the value did not decode
    encoded_bytes = schedule["encoded_bytes"]
    bad_name = schedule["bad_header_name"]
    return sky.request_columns(
        sky.Schedule(
            malformed=first_reason(
                (
                    schedule.isNull(),
                    F.lit(
                        "malformed Avro schedule (neither the AvroSchedule schema nor its older form without headers)"
                    ),
                ),
                # (a header name that is not UTF-8 encodes longer again: the check below names it)
                (
                    encoded_bytes < F.length("value"),
                    F.concat(
                        F.lit("malformed Avro schedule: the value is "),
                        (F.length("value") - encoded_bytes).cast("string"),
                        F.lit(" bytes longer than the schedule it holds"),
                    ),
                ),
            ),
            time_ms=schedule["time"],
            time_reason=F.lit(None).cast("string"),
            topic=schedule["topic"],
            key=schedule["key"],
            value=schedule["value"],
            headers=schedule["headers"],
            checks=(
                F.when(
                    bad_name.isNotNull(),
                    F.concat(F.lit("header name "), quoted(bad_name), F.lit(" is not valid UTF-8")),
                ),
            ),
        ),
        F.col("_sky_avro_headers"),
        settings,
    )
