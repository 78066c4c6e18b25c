"""Decode throughput per dialect, on synthetic Kafka rows (no Kafka, no state): a quick check, not a scenario.

    .venv/bin/python bench/decode_throughput.py [ROWS] [DIALECT ...]

Builds ROWS valid schedule records per dialect in Spark (local[2]), caches them, then times the decode
of each (``dialects.decode``), forced in full by a sum of ``hash`` over every output column: the best of
two runs after a warm-up. Also times the native records decoded inside a decode configured with all
five dialects (each on its own topic); ``DECODE_BENCH_MIXED=all`` does that for every dialect.
``DECODE_BENCH_CONF="key=value;key=value"`` adds Spark settings, ``DECODE_BENCH_LOG`` sets the log level.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.avro.functions import to_avro  # noqa: E402

from kafka_scheduler import dialects  # noqa: E402
from kafka_scheduler.dialects.common import DecodeSettings  # noqa: E402
from kafka_scheduler.dialects.sky_avro import WRITER_SCHEMA  # noqa: E402
from kafka_scheduler.kafka.jars import jar_paths  # noqa: E402

SETTINGS = DecodeSettings(
    rejections_topic="app-schedule-rejections",
    own_topics=("app-schedule-rejections",),
    allowed_destinations=None,
    max_value_bytes=1_000_000,
    max_ahead_ms=100 * 365 * 86_400_000,
)
BASE_S = 1_900_000_000


def b64(data):
    return F.regexp_replace(F.base64(data), r"\s", "")  # Spark's base64 breaks lines (MIME)


def hdr(name, value):
    return F.struct(F.lit(name).alias("key"), value.cast("binary").alias("value"))


def records(spark, dialect: str, rows: int):
    ids = F.col("id")
    secs = F.lit(BASE_S) + ids % 86_400
    payload = F.encode(F.concat(F.lit("payload-"), F.sha2(ids.cast("string"), 256)), "UTF-8")  # ~72 bytes
    key = F.encode(F.concat(F.lit("id-"), ids.cast("string")), "UTF-8")
    trace = hdr("trace", F.concat(F.lit("t-"), ids.cast("string")))
    value = payload
    if dialect == "native":
        headers = F.array(
            trace,
            hdr("x-scheduler-deliver-to", F.lit("orders")),
            hdr("x-scheduler-deliver-at", F.date_format(F.timestamp_seconds(secs), "yyyy-MM-dd'T'HH:mm:ss'Z'")),
            hdr("x-scheduler-request-id", F.concat(F.lit("r-"), ids.cast("string"))),
        )
    elif dialect == "karafka":
        headers = F.array(
            trace,
            hdr("schedule_schema_version", F.lit("1.0.0")),
            hdr("schedule_source_type", F.lit("schedule")),
            hdr("schedule_target_epoch", secs.cast("string")),
            hdr("schedule_target_topic", F.lit("orders")),
            hdr("schedule_target_key", key),
        )
    elif dialect == "etf1":
        headers = F.array(
            trace,
            hdr("scheduler-epoch", secs.cast("string")),
            hdr("scheduler-target-topic", F.lit("orders")),
            hdr("scheduler-target-key", key),
        )
    else:
        schedule = dict(
            time=secs * 1000,
            topic=F.lit("orders"),
            key=key,
            value=payload,
            headers=F.create_map(F.lit("trace"), F.encode(ids.cast("string"), "UTF-8")),
        )
        if dialect == "sky-avro":
            value = to_avro(F.struct(*[c.alias(n) for n, c in schedule.items()]), WRITER_SCHEMA)
        else:
            value = F.encode(
                F.to_json(
                    F.struct(
                        schedule["time"].alias("time"),
                        schedule["topic"].alias("topic"),
                        b64(key).alias("key"),
                        b64(payload).alias("value"),
                        F.create_map(F.lit("trace"), b64(F.encode(ids.cast("string"), "UTF-8"))).alias("headers"),
                    )
                ),
                "UTF-8",
            )
        headers = F.array().cast("array<struct<key:string,value:binary>>")
    return spark.range(rows).select(
        key.alias("key"),
        value.alias("value"),
        F.lit(f"in-{dialect}").alias("topic"),
        (ids % 4).cast("int").alias("partition"),
        ids.alias("offset"),
        F.timestamp_seconds(F.lit(1_767_225_600) + ids % 1000).alias("timestamp"),
        F.lit(0).alias("timestampType"),
        headers.alias("headers"),
    )


def timed(frame, runs: int = 2) -> tuple[float, int]:
    """The best of ``runs`` full evaluations (after one to compile and warm up)."""
    best, n = float("inf"), 0
    for _ in range(runs + 1):
        start = time.perf_counter()
        n = frame.agg(F.sum(F.hash(*frame.columns)).alias("h"), F.count(F.lit(1)).alias("n")).collect()[0]["n"]
        best = min(best, time.perf_counter() - start)
    return best, n


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    wanted = sys.argv[2:] or list(dialects.DIALECT_NAMES)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.driver.memory", "6g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.jars", ",".join(str(p) for p in jar_paths("spark-kafka")))
        .config(map=dict(kv.split("=", 1) for kv in filter(None, os.environ.get("DECODE_BENCH_CONF", "").split(";"))))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel(os.environ.get("DECODE_BENCH_LOG", "ERROR"))
    inputs = {f"in-{d}": d for d in dialects.DIALECT_NAMES}
    for dialect in wanted:
        data = records(spark, dialect, rows).repartition(2).cache()
        data.count()
        base, _ = timed(data)  # the scan of the cache alone
        decoded = dialects.decode(data, {f"in-{dialect}": dialect}, SETTINGS)
        elapsed, n = timed(decoded)
        assert decoded.filter(F.col("kind") != "request").count() == 0, dialect
        line = f"{dialect:9s} alone: {n / elapsed:>10,.0f} rows/s ({elapsed:.2f} s, cache scan {base:.2f} s)"
        if dialect == "native" or "all" in os.environ.get("DECODE_BENCH_MIXED", "native"):
            mixed = dialects.decode(data, inputs, SETTINGS)
            elapsed, n = timed(mixed)
            line += f"; in a 5-dialect decode: {n / elapsed:>10,.0f} rows/s ({elapsed:.2f} s)"
        print(line, flush=True)
        data.unpersist()
    spark.stop()


if __name__ == "__main__":
    main()
