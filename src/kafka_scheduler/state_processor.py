"""The Spark side of the scheduling rules: a ``StatefulProcessor`` keyed by schedule id.

State layout (one grouping key per schedule id, ``sid``):
  * ``pending``: a ValueState holding the pending version (due time, destination,
    key, value, headers, delivery id), absent when nothing is pending;
  * one processing-time timer at the pending version's due time.

All the rules live in ``schedule.py``; this module only adapts Spark's state and timers
to its ``PendingStore`` interface and turns outcomes into output rows. Replacing the
layout (issue: performance) means replacing this module, not the rules.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from typing import Iterable, Iterator, Optional

from pyspark.sql import Row
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import ArrayType, BinaryType, BooleanType, IntegerType, LongType, StringType, StructField, \
    StructType

from .dialects.common import KIND_REJECT
from .partitioning import partition_hash
from .schedule import REJECTIONS_SID, Action, Outcome, Request, Schedule, WriteBack, fire, is_internal, \
    process_requests
from .wheel import headers_of, optional_bytes

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))

# What some dialects add to a schedule (null for native ones): see schedule.Schedule and WriteBack.
EXTRA_FIELDS = [
    StructField("partition", IntegerType()),
    StructField("partition_key", BinaryType()),
    StructField("wb_topic", StringType()),
    StructField("wb_partition", IntegerType()),
    StructField("wb_key", BinaryType()),
    StructField("wb_headers", HEADERS_TYPE),
    StructField("history", BooleanType()),
]

PENDING_SCHEMA = StructType([
    StructField("due_ms", LongType()),
    StructField("topic", StringType()),
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", HEADERS_TYPE),
    StructField("delivery_id", StringType()),
    *EXTRA_FIELDS,
])

# What the processor emits: records to write (deliver, reject) and per-outcome counts (outcome).
OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType()),
    StructField("topic", StringType()),  # destination topic; for outcome rows, the outcome name
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("headers", HEADERS_TYPE),
    StructField("due_ms", LongType()),
    StructField("n", LongType()),
    # deliveries only: the explicit partition, or the partitioner hash of a partition key (the sink takes it
    # modulo the destination's partition count); the write-back to send and whether to copy to history
    StructField("partition", IntegerType()),
    StructField("partition_hash", IntegerType()),
    StructField("wb_topic", StringType()),
    StructField("wb_partition", IntegerType()),
    StructField("wb_key", BinaryType()),
    StructField("wb_headers", HEADERS_TYPE),
    StructField("history", BooleanType()),
    # deliveries only: emitted ahead of its due time, for the driver's timed writer (see wheel.apply_requests)
    StructField("prepared", BooleanType()),
])
OUTPUT_COLUMNS = OUTPUT_SCHEMA.names

KIND_DELIVER = "deliver"
KIND_OUTCOME = "outcome"
OUTCOME_REJECTED = "rejected"


def schedule_from_row(row) -> Schedule:
    wb_headers = row["wb_headers"]
    return Schedule(due_ms=row["due_ms"], topic=row["topic"], key=optional_bytes(row["key"]),
                    value=optional_bytes(row["value"]),
                    headers=headers_of(row["headers"]), delivery_id=row["delivery_id"], partition=row["partition"],
                    partition_key=optional_bytes(row["partition_key"]),
                    write_back=None if wb_headers is None else WriteBack(
                        row["wb_topic"], row["wb_partition"], optional_bytes(row["wb_key"]), headers_of(wb_headers)),
                    history=bool(row["history"]))


_NO_EXTRAS = dict(partition=None, partition_hash=None, wb_topic=None, wb_partition=None, wb_key=None,
                  wb_headers=None, history=None)


def _record(kind: str, topic: str, key, value, headers, due_ms: Optional[int] = None) -> Row:
    return Row(kind=kind, topic=topic, key=key, value=value, headers=list(headers or ()), due_ms=due_ms, n=None,
               **_NO_EXTRAS)


def delivery_row(schedule: Schedule) -> Row:
    back = schedule.write_back
    return Row(kind=KIND_DELIVER, topic=schedule.topic, key=schedule.key, value=schedule.value,
               headers=list(schedule.delivered_headers()), due_ms=schedule.due_ms, n=None,
               partition=schedule.partition,
               partition_hash=partition_hash(schedule.partition_key) if schedule.partition_key is not None else None,
               wb_topic=back and back.topic, wb_partition=back and back.partition, wb_key=back and back.key,
               wb_headers=None if back is None else list(back.headers), history=schedule.history)


def outcome_rows(counts: Counter) -> Iterator[Row]:
    for outcome, n in counts.items():
        yield Row(kind=KIND_OUTCOME, topic=str(outcome.value if isinstance(outcome, Outcome) else outcome),
                  key=None, value=None, headers=None, due_ms=None, n=n, **_NO_EXTRAS)


def in_log_order(rows: Iterable) -> list:
    """Requests of one id in Kafka order: offset order within a partition; partitions merged by timestamp."""
    by_partition = defaultdict(list)
    for row in rows:
        by_partition[(row["src_topic"], row["src_partition"])].append(row)
    streams = [sorted(part, key=lambda r: r["src_offset"]) for part in by_partition.values()]
    if len(streams) == 1:
        return streams[0]
    return list(heapq.merge(*streams, key=lambda r: r["src_ts_ms"]))


class ValueStateStore:
    """``PendingStore`` over one ValueState and the key's processing-time timers.

    Timers are set ``lookahead_ms`` before the due time. One set under another lookahead (an
    earlier run) is not deleted by ``replace``: it fires later, finds nothing due, and re-arms.
    """

    def __init__(self, handle: StatefulProcessorHandle, state, known_empty: bool = False, firing: bool = False,
                 lookahead_ms: int = 0):
        self._handle, self._state = handle, state
        self._lookahead_ms = lookahead_ms
        self._known_empty = known_empty
        self._firing = firing  # the firing timer expires by itself; deleting it is not needed

    def get(self) -> Optional[Schedule]:
        if self._known_empty:
            return None
        row = self._state.get()
        if row is None:
            return None
        return schedule_from_row(row.asDict() if hasattr(row, "asDict") else dict(zip(PENDING_SCHEMA.names, row)))

    def replace(self, old: Optional[Schedule], new: Optional[Schedule]) -> None:
        if old is not None and not self._firing and (new is None or new.due_ms != old.due_ms):
            self._handle.deleteTimer(old.due_ms - self._lookahead_ms)
        if new is None:
            if old is not None:
                self._state.clear()
            return
        back = new.write_back
        self._state.update((new.due_ms, new.topic, new.key, new.value, [tuple(h) for h in new.headers],
                            new.delivery_id, new.partition, new.partition_key,
                            *((None, None, None, None) if back is None else
                              (back.topic, back.partition, back.key, [tuple(h) for h in back.headers])),
                            new.history))
        if old is None or new.due_ms != old.due_ms:
            self.rearm(new)

    def rearm(self, pending: Schedule) -> None:
        self._handle.registerTimer(pending.due_ms - self._lookahead_ms)


class SchedulerProcessor(StatefulProcessor):
    """``lookahead_ms`` as in ``WheelProcessor``: the rules see the batch time shifted by it."""

    def __init__(self, lookahead_ms: int = 0):
        self.lookahead_ms = lookahead_ms

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.pending = handle.getValueState("pending", PENDING_SCHEMA)

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:
        sid = bytes(key[0])
        if sid == REJECTIONS_SID:
            count = 0
            for row in rows:
                count += 1
                yield _record(KIND_REJECT, row["topic"], row["key"], row["value"], row["headers"])
            yield from outcome_rows(Counter({OUTCOME_REJECTED: count}))
            return

        requests = []
        for row in in_log_order(rows):
            action = Action(row["action"])
            requests.append(Request(action, schedule_from_row(row) if action in (Action.ADD, Action.REPLACE) else None,
                                    row["completes"]))
        store = ValueStateStore(self.handle, self.pending, known_empty=is_internal(sid),
                                lookahead_ms=self.lookahead_ms)
        outcomes, due_now = process_requests(store, requests,
                                             timerValues.getCurrentProcessingTimeInMs() + self.lookahead_ms)
        if due_now is not None:
            yield delivery_row(due_now)
        yield from outcome_rows(Counter(outcomes))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:
        store = ValueStateStore(self.handle, self.pending, firing=True, lookahead_ms=self.lookahead_ms)
        due = fire(store, timerValues.getCurrentProcessingTimeInMs() + self.lookahead_ms)
        if due is not None:
            yield delivery_row(due)

    def close(self) -> None:
        pass
