"""The streaming query: the Kafka source of every input topic, the dialect decode per topic, and the state processor
keyed by shard, whose output rows the record sink writes (record_sink.py)."""

from __future__ import annotations

from ..config import Config, spark_kafka_options
from ..dialects import DecodeSettings, decode
from .wheel_processor import (
    OUTPUT_SCHEMA,
    WheelProcessor,
    packed_by_shard,
    parsed_state_schemas,
    record_rows,
    with_shards,
)


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
        # The consumer's default 500 ms fetch wait was measured to add ~0.5 s to every batch
        # that reads requests (the read of a known offset range waits on its last fetch).
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
