"""The streaming query: the Kafka source of every input topic, the dialect decode per topic, and the state processor
keyed by shard, whose output rows the record sink writes (engine/driver/record_sink.py)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ...config import Config, spark_kafka_options
from ...dialects import DecodeSettings, decode
from ...dialects.common import header
from ...protocol import DELIVERY_ID
from ..contract import (
    HEADERS_TYPE,
    KIND_REJECT,
    KIND_TICK,
    OUTPUT_COLUMNS,
    OUTPUT_SCHEMA,
    REJECTIONS_SHARD,
    TICK_REPORT,
)
from ..processor.input import PACKED_REQUESTS, pack_by_shard
from ..processor.wheel_processor import WheelProcessor, parsed_state_schemas


def reads_all_first(config: Config) -> bool:
    """Whether the first batch reads every input to its end, uncapped: on a new checkpoint, or one that gains an
    input, when an input's dialect writes back (its topic holds write-backs and cancels that must act before any
    overdue schedule is delivered). A native topic alone keeps the per-batch cap, which bounds memory. Only that
    batch is uncapped: it runs in a query of its own (Scheduler._catch_up)."""
    return config.catch_up_first and any(d != "native" for d in config.input_topics.values())


def build_stream(spark, config: Config, run: str = "", capped: bool = True, started_ms: int | None = None):
    """The streaming DataFrame of output rows (deliveries, rejections, outcome counts, armed timers,
    withdrawals). ``run`` names this driver process (its timed writer holds what the batches prepare).
    ``capped``: a batch reads at most --max-requests-per-batch records. The Kafka source reads that option once,
    when its query starts, so a query is capped for its whole life or not at all. ``started_ms``: when this driver
    process started (a skip cron's firing due before was missed: the job was down)."""
    inputs = config.input_topics
    reader = (
        spark.readStream.format("kafka")
        .option("subscribe", ",".join([*inputs, config.ticks_topic]))
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        # The consumer's default 500 ms fetch wait would add as much to every batch that reads requests (the
        # read of a known offset range waits on its last fetch).
        .option("kafka.fetch.max.wait.ms", "20")
        # A request producer's aborted transaction (Karafka's producers use them) must not act, nor, in
        # exactly-once mode, the job's own write-backs of an aborted transaction.
        .option("kafka.isolation.level", "read_committed")
        .options(**spark_kafka_options(config))
    )
    if config.max_requests_per_batch and capped:
        reader = reader.option("maxOffsetsPerTrigger", str(config.max_requests_per_batch))
    requests = decode(reader.load(), inputs, DecodeSettings.from_config(config))
    return record_rows(
        packed_by_shard(with_shards(requests, config.shards, config.ticks_topic))
        .groupBy("shard")
        .transformWithStateInPandas(
            statefulProcessor=WheelProcessor(
                config.lookahead,
                run,
                started_ms,
                config.cron_min_interval,
                config.rejections_topic,
                parsed_state_schemas(),
            ),
            outputStructType=OUTPUT_SCHEMA,
            outputMode="Update",
            timeMode="ProcessingTime",
        )
    )


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


def shard_column(shards: int) -> Column:
    """The grouping key: a stable hash of the schedule id; rejections share one key of their own."""
    return F.when(F.col("kind") == KIND_REJECT, F.lit(REJECTIONS_SHARD)).otherwise(
        F.pmod(F.xxhash64("sid"), F.lit(shards)).cast("int")
    )


def with_shards(requests, shards: int, ticks_topic: str):
    """Each request row with its shard; a report tick read from ``ticks_topic`` goes to every shard (each
    reports its armed timers), a wake-up tick to none (reading it was its whole purpose)."""
    is_tick = F.col("src_topic") == ticks_topic
    report = is_tick & (F.col("value") == F.lit(TICK_REPORT))
    rows = requests.filter(~is_tick | report).withColumn(
        "kind", F.when(is_tick, F.lit(KIND_TICK)).otherwise(F.col("kind"))
    )
    return rows.withColumn(
        "shard",
        F.explode(F.when(is_tick, F.sequence(F.lit(0), F.lit(shards - 1))).otherwise(F.array(shard_column(shards)))),
    )


def packed_by_shard(rows: DataFrame) -> DataFrame:
    """``rows`` (with their ``shard``) as (shard, requests blob) rows, a blob per shard per Arrow batch."""
    return rows.mapInArrow(pack_by_shard, PACKED_REQUESTS)
