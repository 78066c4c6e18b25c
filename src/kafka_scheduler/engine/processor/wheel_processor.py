"""The Spark side of the bulk layout (engine/rules/): a pandas ``StatefulProcessor`` keyed by shard.

Requests arrive as pandas frames (Arrow batches); chunks of schedules are stored as
Arrow IPC blobs (lz4), so the add and fire paths move schedules in bulk and make state
calls per bucket. The id index lives in the worker's memory (``index_cache``): a handler call
makes a constant few state calls for it, whatever the number of requests with ids.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator

import pandas as pd
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    DataType,
)

from ...delivery_ids import request_of
from ..contract import (
    DELIVERED_AT_ONCE,
    INDEX_ENTRIES_PREFIX,
    KIND_OUTCOME,
    KIND_REJECT,
    KIND_TICK,
    OUTPUT_COLUMNS,
    REJECTIONS_SHARD,
    SKIPPED_FIRINGS,
)
from ..rules.batch import apply_requests, expired_mask, fire
from ..rules.batch_result import BatchResult
from ..rules.buckets import BUCKET_INFO_DDL
from ..rules.cells import missing
from ..rules.cron_rules import DEFAULT_CRON_MIN_INTERVAL_MS
from ..rules.entries import named_rows, schedule_of_entry
from ..rules.fields import ENTRY_COLUMNS, INDEX_COLUMNS
from ..rules.schedule import Action, Request, input_topic_of, is_cron, is_internal
from .blobs import header_lists
from .input import log_order, unpacked
from .output import (
    batch_time_frame,
    deliveries_frame,
    merged,
    outcomes_frame,
    records_frame,
    rejection_counts,
    rejections_frame,
    timer_frame,
    withdraw_frame,
)
from .state_store import MapStateShardStore

# The state variables, as WheelProcessor attributes: (state name, value schema) for a value state, (state name, key
# schema, value schema) for a map state, in DDL.
STATE_VARIABLES = {
    "seq": ("seq", "seq long"),
    "index_token": ("index_token", "version long, base long, nonces array<long>, sizes array<long>, entries long"),
    "deltas": ("index_deltas", "version long, part int", "data binary"),
    "buckets": ("buckets", "bucket long", BUCKET_INFO_DDL),
    "chunks": ("chunks", "bucket long, n int", "data binary"),
    "strikes": ("strikes", "bucket long, n int", "delivery_ids array<string>"),
    "armed": ("armed", "timer_ms long", "buckets array<long>"),
    # Paused crons: the definition (a one-row chunk blob), keyed by the cron's sid.
    "paused": ("paused", "sid binary", "data binary"),
    # Where the buckets are among the levels (``buckets.Levels``): one value per shard, read once per call that files or
    # locates a schedule. A checkpoint without it gets it from its bucket keys (added for spread dues).
    "levels": ("levels", "fine_mark long, coarse array<long>, listed array<long>"),
}


def parsed_state_schemas() -> dict:
    """DDL -> StructType of every state schema, parsed on the driver once. Given DDL, a task's init asks the JVM to
    parse each schema (a round trip and a parse per schema, in every task of every batch)."""
    return {ddl: DataType.fromDDL(ddl) for _, *schemas in STATE_VARIABLES.values() for ddl in schemas}


def delivered_at_once(result: BatchResult) -> Counter:
    """Per input topic, the schedules due when read that the call delivers: the rules' ``at_once`` less those later
    than their max lateness, which go to the rejections topic as expired. Among a call's emitted rows, the expired
    ones that are no cron firing are exactly those (a row prepared ahead is not due yet)."""
    expired = Counter()
    for frame in result.emitted:
        late = expired_mask(frame)
        if not late.any():
            continue
        for sid, delivery_id in zip(frame["sid"][late], frame["delivery_id"][late]):
            if sid is not None and not isinstance(sid, float) and is_cron(bytes(sid)):
                continue
            client = sid is not None and not isinstance(sid, float) and input_topic_of(sid)
            expired[client or request_of(delivery_id)[0]] += 1
    return result.at_once - expired


def freeze_what_the_worker_has_loaded() -> bool:
    """Once per worker process: what it holds by its first state step (the modules of PySpark, pandas, pyarrow and
    ours, ~76,000 objects) leaves the garbage collector's care for good. PySpark's daemon runs a full collection after
    every task a reused worker runs, and each visited all of them again: ~40 ms a task (docs/measurements.md). Objects
    frozen are still freed when nothing refers to them; only a cycle among them would stay, and there is one such
    moment per process. Returns whether this call froze."""
    if gc.get_freeze_count():
        return False
    gc.collect()
    gc.freeze()
    return True


class WheelProcessor(StatefulProcessor):
    """``window_ms``: schedules due up to this far after the batch time are prepared (emitted for the
    driver's timed writer, kept in state until retired); ``run`` names the driver process whose writer
    holds what this run prepares (``buckets.BucketInfo``'s prepare mark); ``started_ms``: when it started (a skip cron's
    firing due before was missed); ``rejections_topic``: where CRON_ADDs the rules refuse go; ``parsed_schemas``:
    ``parsed_state_schemas()``, made on the driver (without it, each task's init has the JVM parse each DDL)."""

    def __init__(
        self,
        window_ms: int = 0,
        run: str = "",
        started_ms: int | None = None,
        cron_min_interval_ms: int = DEFAULT_CRON_MIN_INTERVAL_MS,
        rejections_topic: str = "",
        parsed_schemas: dict | None = None,
    ):
        self.parsed_schemas = parsed_schemas or {}
        self.window_ms = window_ms
        self.run = run
        self.started_ms = started_ms
        self.cron_min_interval_ms = cron_min_interval_ms
        self.rejections_topic = rejections_topic

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_what_the_worker_has_loaded()
        self.handle = handle
        for attribute, (name, *schemas) in STATE_VARIABLES.items():
            schemas = [self.parsed_schemas.get(ddl, ddl) for ddl in schemas]
            setattr(
                self,
                attribute,
                handle.getValueState(name, *schemas) if len(schemas) == 1 else handle.getMapState(name, *schemas),
            )
        self.store = MapStateShardStore(self)
        self.new_timers: list[int] = []

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:
        yield from merged(self._input_frames(key, unpacked(rows), timerValues))

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        yield from merged(self._timer_frames(key, timerValues, expiredTimerInfo))

    def _input_frames(self, key, frame: pd.DataFrame | None, timerValues) -> Iterator[pd.DataFrame]:
        self.new_timers = []
        if frame is None:
            return
        ticks = frame["kind"] == KIND_TICK
        if ticks.any():
            armed = list(self.handle.listTimers())
            if armed:
                yield timer_frame(armed)
            frame = frame[~ticks].reset_index(drop=True)
            if not len(frame):
                # The start's report tick is the one call every shard gets: its index size too, or the pending
                # gauge would sum only the shards a request or a timer has reached since the start.
                self.store.use_shard(int(key[0]))
                yield from self._reports(int(key[0]), timerValues.getCurrentProcessingTimeInMs())
                return
        if int(key[0]) == REJECTIONS_SHARD:
            yield records_frame(
                KIND_REJECT,
                frame["topic"].to_numpy(),
                frame["key"].to_numpy(),
                frame["value"].to_numpy(),
                header_lists(frame["headers"]),
                None,
            )
            yield outcomes_frame(rejection_counts(frame))
            return
        shard = int(key[0])
        self.store.use_shard(shard)
        anonymous_mask = frame["sid"].map(is_internal).astype(bool)
        base_columns = [c for c in ENTRY_COLUMNS if c not in INDEX_COLUMNS]
        anonymous = (
            frame.loc[anonymous_mask, base_columns + ["src_topic"]].assign(sid=None, digest=None).reset_index(drop=True)
        )
        client = frame[~anonymous_mask]
        # An ADD or REPLACE (or CRON_ADD) whose id no other request of the batch names needs no log order: filed
        # in bulk unless its id has a pending version (or cron).
        unique = ~client["sid"].duplicated(keep=False)
        alone = (unique & client["action"].isin([Action.ADD.value, Action.REPLACE.value])).to_numpy()
        cron_alone = (unique & (client["action"] == Action.CRON_ADD.value)).to_numpy()
        keyed = (
            client.loc[alone, base_columns + ["sid", "action", "src_topic"]].assign(digest=None).reset_index(drop=True)
        )
        cron_adds = (
            client.loc[cron_alone, base_columns + ["sid", "src_topic", "raw_headers"]]
            .assign(digest=None)
            .reset_index(drop=True)
        )
        requests = []
        for row in named_rows(log_order(client[~alone & ~cron_alone])):
            action = Action(row.action)
            schedule = schedule_of_entry(row) if action in (Action.ADD, Action.REPLACE, Action.CRON_ADD) else None
            completes = None if missing(row.completes) else row.completes
            requests.append(
                (
                    bytes(row.sid),
                    Request(
                        action,
                        schedule,
                        completes,
                        raw_headers=None if missing(row.raw_headers) else row.raw_headers,
                        activation=row.delivery_id,
                    ),
                )
            )
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        result = apply_requests(
            self.store,
            requests,
            now_ms,
            anonymous,
            self.window_ms,
            self.run,
            keyed,
            cron_adds,
            started_ms=self.started_ms,
            cron_min_interval_ms=self.cron_min_interval_ms,
        )
        for emitted in result.emitted:
            if len(emitted):
                yield deliveries_frame(emitted, now_ms)
        for rejected in result.rejected:
            yield rejections_frame(rejected, self.rejections_topic)
        if result.withdrawn:
            yield withdraw_frame(result.withdrawn)
        if self.new_timers:
            yield timer_frame(self.new_timers)
        yield outcomes_frame(
            result.by_topic
            + Counter({(DELIVERED_AT_ONCE, t): n for t, n in delivered_at_once(result).items()})
            + Counter({SKIPPED_FIRINGS: result.skipped})
        )
        yield from self._reports(shard, now_ms)

    def _timer_frames(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        self.new_timers = []
        shard = int(key[0])
        self.store.use_shard(shard)
        now_ms = timerValues.getCurrentProcessingTimeInMs()
        counts = Counter()
        for due in fire(
            self.store,
            expiredTimerInfo.getExpiryTimeInMs(),
            now_ms,
            self.window_ms,
            self.run,
            started_ms=self.started_ms,
            counts=counts,
        ):
            if len(due):
                yield deliveries_frame(due, now_ms)
        if self.new_timers:
            yield timer_frame(self.new_timers)
        if counts:
            yield outcomes_frame(Counter({SKIPPED_FIRINGS: counts["skipped"]}))
        yield from self._reports(shard, now_ms)

    def _reports(self, shard: int, now_ms: int) -> Iterator[pd.DataFrame]:
        """Contract with the sink: after each call, the batch's processing time (BATCH_TIME), and the entries of the
        shard's index (zero too), as outcome rows. The index size is read from the token (one state call): the cache
        may not have been synced in this call. ``due_ms`` carries the index version, so the sink can keep the last
        of a shard's reports in a batch."""
        yield batch_time_frame(now_ms)
        version, entries = self.store.index_size()
        if entries >= 0:  # unknown until the next call that uses the index rebuilds it
            yield pd.DataFrame(
                [
                    {
                        **dict.fromkeys(OUTPUT_COLUMNS),
                        "kind": KIND_OUTCOME,
                        "topic": f"{INDEX_ENTRIES_PREFIX}{shard}",
                        "n": entries,
                        "due_ms": version,
                    }
                ],
                columns=OUTPUT_COLUMNS,
            )

    def close(self) -> None:
        pass
