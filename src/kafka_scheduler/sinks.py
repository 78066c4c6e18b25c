"""Writes each micro-batch's records to Kafka: deliveries, rejections and (optionally) history.

Runs as the query's ``foreachBatch`` function. One Spark job summarises the batch
(outcome counts, destination topics); deliveries whose destination topic does not
exist are diverted to the rejections topic instead of failing the batch; then one
Kafka write sends every record kind. The batch is cached so the stateful step runs once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Callable, Optional

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from .config import Config
from .dialects.common import header
from .protocol import DELIVERED_TO, DELIVERY_ID, DUE_MS, REJECTION_REASON, SOURCE_OFFSET, SOURCE_PARTITION, \
    SOURCE_TOPIC
from .metrics import BatchSummary
from .state_processor import KIND_DELIVER, KIND_OUTCOME
from .topics import TopicDirectory

log = logging.getLogger(__name__)


# Producer settings for the Kafka sink: wait for the broker's acknowledgement, batch and compress.
PRODUCER_OPTIONS = {
    "kafka.acks": "all",
    "kafka.linger.ms": "5",
    "kafka.compression.type": "lz4",
    "kafka.max.request.size": str(8 * 1024 * 1024),
}


# The kind of the history copies among the records written (the processor emits deliver and reject).
KIND_HISTORY = "history"

# With a lookahead, held deliveries go out in slices this wide, each once its last due time has passed.
HOLD_SLICE_MS = 50


class StopRequested(Exception):
    """Raised at the start of a batch once a stop was asked for: the batch writes nothing and is not committed."""


class RecordSink:
    def __init__(self, config: Config, topics: TopicDirectory, stop_requested: threading.Event,
                 on_batch: Optional[Callable[[BatchSummary], None]] = None):
        self.config = config
        self.topics = topics
        self.stop_requested = stop_requested
        self.on_batch = on_batch
        self.refused_batch: Optional[int] = None  # set when a stop made it refuse a batch

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self.stop_requested.is_set():
            self.refused_batch = batch_id
            raise StopRequested(f"stop requested before batch {batch_id}")
        batch = batch.persist()
        started = time.monotonic()
        try:
            summary, per_topic = self._summarise(batch, batch_id)
            summary.compute_s = time.monotonic() - started
            missing = self.topics.missing(set(per_topic)) if per_topic else set()
            if summary.delivered or summary.outcomes.get("rejected"):
                summary.held = self._write(self._records(batch, missing))
            summary.written_at_ms = int(time.time() * 1000)
            summary.write_s = time.monotonic() - started - summary.compute_s
            summary.dead_lettered = sum(per_topic[t] for t in missing)
            summary.delivered -= summary.dead_lettered
        finally:
            batch.unpersist()
        if self.on_batch is not None:
            self.on_batch(summary)

    def _save(self, records: DataFrame) -> None:
        records.select("topic", "key", "value", "headers").write.format("kafka") \
            .option("kafka.bootstrap.servers", self.config.bootstrap_servers).options(**PRODUCER_OPTIONS).save()

    def _write(self, records: DataFrame, now_ms: Optional[int] = None) -> int:
        """Everything due by ``now_ms`` (default: now) at once; with a lookahead, the rest in slices, each
        at its due time. Returns how many deliveries (not history copies) were held until their due time.
        """
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        if not self.config.lookahead:
            self._save(records)
            return 0
        held = F.col("due_ms").isNotNull() & (F.col("due_ms") > now_ms)
        self._save(records.filter(~held))
        slice_of = F.ceil(F.col("due_ms") / F.lit(HOLD_SLICE_MS)).cast("long")
        rows = records.filter(held).groupBy(slice_of.alias("slice")).agg(
            F.sum(F.when(F.col("kind") == KIND_DELIVER, 1).otherwise(0)).alias("deliveries")).collect()
        for number in sorted(row["slice"] for row in rows):
            end_ms = number * HOLD_SLICE_MS
            pause = end_ms / 1000 - time.time()
            if pause > 0:
                time.sleep(pause)
            self._save(records.filter(held & (slice_of == number)))
        return sum(row["deliveries"] for row in rows)

    def _summarise(self, batch: DataFrame, batch_id: int) -> tuple[BatchSummary, Counter]:
        """Outcome counts, and deliveries per destination topic, in one Spark job."""
        rows = batch.groupBy("kind", "topic").agg(
            F.count(F.lit(1)).alias("records"), F.sum("n").alias("n"), F.min("due_ms").alias("earliest_due")
        ).collect()
        summary = BatchSummary(batch_id)
        per_topic: Counter = Counter()
        for row in rows:
            if row["kind"] == KIND_OUTCOME:
                summary.outcomes[row["topic"]] += row["n"]
            elif row["kind"] == KIND_DELIVER:
                summary.delivered += row["records"]
                per_topic[row["topic"]] += row["records"]
                if summary.earliest_due_ms is None or row["earliest_due"] < summary.earliest_due_ms:
                    summary.earliest_due_ms = row["earliest_due"]
        return summary, per_topic

    def _records(self, batch: DataFrame, missing: set[str]) -> DataFrame:
        """Deliveries, rejections, dead letters and history rows; ``kind`` and ``due_ms`` kept for the hold."""
        records = batch.filter(F.col("kind") != KIND_OUTCOME)
        if missing:
            records = self._dead_letter(records, missing)
        columns = ["kind", "topic", "key", "value", "headers", "due_ms"]
        if self.config.history:
            history = records.filter(F.col("kind") == KIND_DELIVER).select(
                F.lit(KIND_HISTORY).alias("kind"), F.lit(self.config.history_topic).alias("topic"), "key", "value",
                F.concat("headers", F.array(header(DELIVERED_TO, F.col("topic")),
                                            header(DUE_MS, F.col("due_ms").cast("string")))).alias("headers"),
                "due_ms")
            return records.select(*columns).unionByName(history)
        return records.select(*columns)

    def _dead_letter(self, records: DataFrame, missing: set[str]) -> DataFrame:
        """Deliveries to topics that do not exist go to the rejections topic, with the reason and source."""
        undeliverable = (F.col("kind") == KIND_DELIVER) & F.col("topic").isin(*missing)
        delivery_id = F.element_at(
            F.filter("headers", lambda h: h["key"] == DELIVERY_ID), -1)["value"].cast("string")
        source = r"^(.*)-(\d+)-(\d+)$"
        reason = F.concat(F.lit("destination topic '"), F.col("topic"), F.lit("' does not exist"))
        extra = F.array(
            header(REJECTION_REASON, F.encode(reason, "UTF-8")),
            header(SOURCE_TOPIC, F.regexp_extract(delivery_id, source, 1)),
            header(SOURCE_PARTITION, F.regexp_extract(delivery_id, source, 2)),
            header(SOURCE_OFFSET, F.regexp_extract(delivery_id, source, 3)),
        )
        return records.select(
            F.when(undeliverable, F.lit("reject")).otherwise(F.col("kind")).alias("kind"),
            F.when(undeliverable, F.lit(self.config.rejections_topic)).otherwise(F.col("topic")).alias("topic"),
            "key", "value",
            F.when(undeliverable, F.concat("headers", extra)).otherwise(F.col("headers")).alias("headers"),
            F.when(undeliverable, F.lit(None)).otherwise(F.col("due_ms")).alias("due_ms"),
        )
