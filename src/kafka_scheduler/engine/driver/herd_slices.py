"""How the sink's herds are written (the herd writer's ``HerdSlices``): each herd is a filter of its batch's local
checkpoint, written a slice at a time by a Spark job, or with exactly-once by the executors in transactions of their
own; a batch's checkpoint is freed once the batch is written and every herd read from it is too."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NamedTuple

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ...config import Config
from ...kafka.topics import TopicDirectory
from ..contract import HERD_COLUMNS
from .exactly_once import HERD_TASK_RESULT, TransactionalSender, herd_member, write_herd_partition
from .herd_writer import slice_end_ms, slice_start_ms
from .sink_columns import SinkColumns

log = logging.getLogger(__name__)

# Withdrawn delivery ids up to this many leave a herd's slice through an IN list; more, through an anti-join.
WITHDRAWN_IN_LIST = 1000


class _Kept(NamedTuple):
    batch: DataFrame  # the batch's checkpoint the herd is read from: kept until every herd read from it is written
    deadlines: dict  # per slice: its earliest expiry (due + max lateness)


class SparkHerdSlices:
    """The herds a sink handed on, their batches' checkpoints, and their writes. The sink says which batch it is
    writing (``batch_begins``, ``batch_ends``) and keeps each herd it hands on (``keep``); the herd writer writes
    and releases them (``write``, ``release``, ``before_retry``)."""

    def __init__(
        self,
        config: Config,
        topics: TopicDirectory,
        columns: SinkColumns,
        kafka_write: Callable[[DataFrame], None],
        sender: TransactionalSender | None = None,
    ):
        self.config = config
        self.topics = topics
        self.columns = columns
        self.kafka_write = kafka_write
        self.sender = sender  # with exactly-once
        self._kept: dict[int, _Kept] = {}  # per herd handed on (by id)
        self._batch: DataFrame | None = None  # the batch being written, while it is

    def batch_begins(self, batch: DataFrame) -> None:
        self._batch = batch

    def batch_ends(self, batch: DataFrame) -> None:
        self._batch = None
        self._free_unless_read(batch)

    def keep(self, herd: DataFrame, deadlines: dict) -> None:
        """A herd read from the batch being written, to be handed to the herd writer; ``deadlines``: per slice, its
        earliest due + max lateness."""
        self._kept[id(herd)] = _Kept(self._batch, deadlines)

    def write(
        self, herd: DataFrame, numbers: list, withdrawn: frozenset, after: int | None, through: int | None
    ) -> None:
        """Slices ``numbers`` of a herd, less the withdrawn delivery ids, only what is due after ``after`` and by
        ``through`` where given."""
        slice_of = self.columns.slice_of
        records = herd.filter(slice_of == numbers[0]) if len(numbers) == 1 else herd.filter(slice_of.isin(numbers))
        if after is not None:
            records = records.filter(F.col("due_ms") > F.lit(after))
        if through is not None:
            records = records.filter(F.col("due_ms") <= F.lit(through))
        if withdrawn:
            if len(withdrawn) <= WITHDRAWN_IN_LIST:
                records = records.filter(~F.col("delivery_id").isin(sorted(withdrawn)))
            else:
                ids = herd.sparkSession.createDataFrame([(i,) for i in withdrawn], "delivery_id string")
                records = records.join(F.broadcast(ids), "delivery_id", "left_anti")
        # Its expired deliveries are rejections, as in a batch; they count in no batch's summary.
        deadlines = [self._kept[id(herd)].deadlines.get(n) for n in numbers]
        records = self.columns.expire(records, min((d for d in deadlines if d is not None), default=None), None)
        if self.sender is not None:
            low = slice_start_ms(min(numbers)) - 1 if after is None else after
            high = slice_end_ms(max(numbers)) if through is None else through
            self._write_transactions(records, low, high)
        else:
            self.kafka_write(records)

    def release(self, herd: DataFrame) -> None:
        """Every slice of ``herd`` is written."""
        kept = self._kept.pop(id(herd), None)
        if kept is not None:
            self._free_unless_read(kept.batch)

    def before_retry(self) -> None:
        """Before a failed herd write is tried again: a destination may have been deleted or denied since."""
        self.topics.invalidate()

    def _write_transactions(self, records: DataFrame, after: int, through: int) -> None:
        """Exactly-once: each task writes its part of the herd in transactions of its own with their ledger
        entries (exactly_once.write_herd_partition); nothing goes through the driver. What the ledger already holds
        (an earlier attempt's committed transactions, a previous run's) is left out. A failed write fences the
        tasks' transactional ids (aborting what they left open) before it is tried again; afterwards the driver
        reads what the tasks committed into the ledger, so that a retry leaves it out and a trim keeps it."""
        sender = self.sender
        if sender.unsettled:  # else every ledger record past the sender's position is its own, already known
            sender.catch_up()
        written = sender.written_keys(after, through)
        if written:
            keys = records.sparkSession.createDataFrame([(k,) for k in written], "ledger_key string")
            records = records.join(
                F.broadcast(keys), F.concat_ws("\t", "delivery_id", "topic") == keys["ledger_key"], "left_anti"
            )
        records = records.select(*HERD_COLUMNS)
        members = [herd_member(p) for p in range(records.rdd.getNumPartitions())]
        task = write_herd_partition(
            sender.producer_settings, self.config.app_id, self.config.ledger_topic, self.config.rejections_topic
        )
        sender.foreign_writes_begin()
        try:
            results = records.mapInArrow(task, HERD_TASK_RESULT).collect()
            failures = [row["failure"] for row in results if row["failure"]]
            if failures:
                raise RuntimeError(f"{len(failures)} task(s) of the herd's write failed, the first: {failures[0]}")
        except BaseException:
            try:
                sender.fence_members(members)
                sender.catch_up(settled=True)
            except Exception as exc:
                log.warning(
                    "herd writer: after a failed write, fencing its tasks or reading the ledger failed too (%s)",
                    " ".join(str(exc).split())[:200],
                )
            raise
        sender.catch_up(settled=True)

    def _free_unless_read(self, batch: DataFrame) -> None:
        """Free a batch's checkpoint unless the batch is still being written or a herd handed on is read from it.
        Called from the batch (its end) and from the herd writer's thread (a herd written): whichever comes last
        frees it."""
        if batch is not self._batch and not any(kept.batch is batch for kept in list(self._kept.values())):
            release_checkpoint(batch)


def release_checkpoint(batch: DataFrame) -> None:
    """Free the blocks of a batch's local checkpoint once it is written (and any herd read from it). PySpark has no
    call for it: through the plan's RDD; should that fail, Spark's context cleaner frees them once the RDD is
    unreachable."""
    try:
        batch._jdf.queryExecution().analyzed().rdd().unpersist(False)
    except Exception as exc:
        log.debug("a written batch's checkpoint is left to Spark's cleaner (%s)", exc)
