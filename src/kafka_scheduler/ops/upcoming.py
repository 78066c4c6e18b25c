"""Pending schedules read from the state store while the job runs: the counts of /api/upcoming (per hour and day,
the earliest due time), which the counted gauges of /metrics read too, and the reads on request (``StateReader``).

Reading the state store costs a Spark job: it is done only when someone asks (never on the batch path, never on a
timer), /api/upcoming at most every UPCOMING_MAX_AGE_S (or 20 times as long as the last read took, whichever is
longer) in a background thread while the last result is served. A scrape of /metrics asks too: the counted gauges
(all pending schedules, the earliest due time) come from the same read, so a job nobody watches reads nothing and a
watched one spends at most ~5% of its time reading.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial

from .inspection import iso_ms

log = logging.getLogger(__name__)

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
HOURS_SHOWN = 48
DAYS_SHOWN = 30
UPCOMING_MAX_AGE_S = 30.0
STATE_READ_SPACING = 20.0  # a recount starts no sooner than this many times the last read's duration after it
STATE_READ_WAIT_S = 120.0  # a look-up waits at most this long for a state read in flight


# ---------------------------------------------------------------- /api/upcoming (pure)


@dataclass
class PendingCounts:
    total: int = 0
    overdue: int = 0  # due before as_of: being delivered, or delivered and not yet retired by a batch
    per_hour: Counter = field(default_factory=Counter)  # start of hour (ms) -> schedules due in it
    per_day: Counter = field(default_factory=Counter)
    earliest_due_ms: int | None = None  # of those not yet due at as_of
    crons: int = 0  # running crons among them (the chart counts each of their firings in its hour)
    firings_estimated_from_ms: int | None = None  # per-day firing counts of dense crons estimated from then on

    @property
    def not_due(self) -> int:
        return self.total - self.overdue


def count_pending(frames: Iterable, as_of_ms: int) -> PendingCounts:
    """Counts of pending schedules (entries frames of engine/spark/state_reader.py: a ``due_ms`` column). A running
    cron is one schedule, and in the hours and days of the chart each of its firings counts
    (inspection.FiringCounter)."""
    from .inspection import FiringCounter

    counts = PendingCounts()
    firings = FiringCounter(
        as_of_ms,
        as_of_ms // HOUR_MS * HOUR_MS + HOURS_SHOWN * HOUR_MS,
        as_of_ms // DAY_MS * DAY_MS + DAYS_SHOWN * DAY_MS,
    )
    for frame in frames:
        if "cron_expr" in frame:
            counts.crons += int(frame["cron_expr"].notna().sum())
            firings.add(frame)
        due = frame["due_ms"].astype("int64")
        counts.total += len(due)
        overdue = due < as_of_ms
        counts.overdue += int(overdue.sum())
        if not overdue.all():
            low = int(due[~overdue].min())
            counts.earliest_due_ms = low if counts.earliest_due_ms is None else min(counts.earliest_due_ms, low)
        counts.per_hour.update(Counter((due // HOUR_MS * HOUR_MS).tolist()))
        counts.per_day.update(Counter((due // DAY_MS * DAY_MS).tolist()))
    counts.per_hour.update(firings.per_hour)
    counts.per_day.update(firings.per_day)
    counts.firings_estimated_from_ms = firings.estimated_from_ms
    return counts


def counts_json(counts: PendingCounts) -> str:
    """A partition's counts, as its executor task returns them (``_count_state``)."""
    return json.dumps(
        {
            "total": counts.total,
            "overdue": counts.overdue,
            "per_hour": list(counts.per_hour.items()),
            "per_day": list(counts.per_day.items()),
            "earliest_due_ms": counts.earliest_due_ms,
            "crons": counts.crons,
            "firings_estimated_from_ms": counts.firings_estimated_from_ms,
        }
    )


def merged_counts(parts: Iterable[str]) -> PendingCounts:
    """The counts of every partition (``counts_json``) as one."""
    counts = PendingCounts()
    for part in map(json.loads, parts):
        counts.total += part["total"]
        counts.overdue += part["overdue"]
        counts.per_hour.update(dict(part["per_hour"]))
        counts.per_day.update(dict(part["per_day"]))
        counts.crons += part["crons"]
        for name in ("earliest_due_ms", "firings_estimated_from_ms"):
            value, known = part[name], getattr(counts, name)
            setattr(counts, name, known if value is None else value if known is None else min(value, known))
    return counts


def _count_partition(as_of_ms: int, frames: Iterable) -> str:
    return counts_json(count_pending(frames, as_of_ms))


def upcoming_json(counts: PendingCounts, as_of_ms: int, batch: int | None) -> dict:
    """48 hourly and 30 daily buckets from the current hour and day (UTC), zeros included, and what lies beyond."""
    first_hour = as_of_ms // HOUR_MS * HOUR_MS
    first_day = as_of_ms // DAY_MS * DAY_MS
    hours = [
        {"start": iso_ms(h), "count": counts.per_hour.get(h, 0)}
        for h in range(first_hour, first_hour + HOURS_SHOWN * HOUR_MS, HOUR_MS)
    ]
    days = [
        {"date": iso_ms(d)[:10], "count": counts.per_day.get(d, 0)}
        for d in range(first_day, first_day + DAYS_SHOWN * DAY_MS, DAY_MS)
    ]
    return {
        "as_of": iso_ms(as_of_ms),
        "as_of_ms": as_of_ms,
        "batch": batch,
        "total": counts.total,
        "due_not_retired": counts.overdue,
        "earliest_due": iso_ms(counts.earliest_due_ms) if counts.earliest_due_ms is not None else None,
        "earliest_due_ms": counts.earliest_due_ms,
        "hours": hours,
        "days": days,
        "crons": counts.crons,
        "firings_estimated_from": None
        if counts.firings_estimated_from_ms is None
        else iso_ms(counts.firings_estimated_from_ms)[:10],
        "before_hours": sum(n for h, n in counts.per_hour.items() if h < first_hour),
        "after_hours": sum(n for h, n in counts.per_hour.items() if h >= first_hour + HOURS_SHOWN * HOUR_MS),
        "after_days": sum(n for d, n in counts.per_day.items() if d >= first_day + DAYS_SHOWN * DAY_MS),
    }


# ---------------------------------------------------------------- the state store, read on request


class StateReader:
    """Spark reads of the job's checkpoint, one at a time, once the job's Spark session is up."""

    def __init__(self):
        self._lock = threading.Lock()  # one state read at a time: each is a Spark job on the job's cores
        self._spark = None
        self._checkpoint_dir: str | None = None

    def attach(self, spark, checkpoint_dir: str) -> None:
        self._spark, self._checkpoint_dir = spark, checkpoint_dir

    def detach(self) -> None:
        """Before the session stops: waits (a while) for a read in flight."""
        got = self._lock.acquire(timeout=30)
        self._spark = None
        if got:
            self._lock.release()

    @property
    def ready(self) -> bool:
        return self._spark is not None

    def run(self, read: Callable, empty: Callable, timeout: float = STATE_READ_WAIT_S):
        """``read(spark, checkpoint_dir, batch)``, or ``empty()`` before the first batch has committed (no state to
        read yet); None when Spark is not (or no longer) up."""
        if not self._lock.acquire(timeout=timeout):
            raise TimeoutError("another state read is still running")
        try:
            spark, checkpoint_dir = self._spark, self._checkpoint_dir
            if spark is None:
                return None
            from ..engine.spark.checkpoint import is_local, last_committed_batch

            # Only a local checkpoint tells its batch here (one on hdfs:// and the like needs Spark's Hadoop).
            batch = last_committed_batch(checkpoint_dir) if is_local(checkpoint_dir) else None
            if batch is None and is_local(checkpoint_dir):
                return empty()
            sc = spark.sparkContext
            sc.setJobDescription("kafka-scheduler status page: state read")
            try:
                return read(spark, checkpoint_dir, batch)
            finally:
                sc.setJobDescription(None)
        finally:
            self._lock.release()


def _count_state(spark, checkpoint_dir: str, as_of_ms: int) -> PendingCounts:
    """Counted by the executors, partition by partition (CheckpointState.fold_pending): the chunks stay out of the
    driver's heap."""
    from ..engine.spark.state_reader import CheckpointState

    return merged_counts(CheckpointState(spark, checkpoint_dir).fold_pending(partial(_count_partition, as_of_ms)))


class UpcomingCache:
    """The last /api/upcoming answer; a request finding it older than ``max_age_s`` starts one recount in the
    background and gets the last answer meanwhile."""

    def __init__(
        self,
        reader: StateReader,
        max_age_s: float = UPCOMING_MAX_AGE_S,
        clock: Callable[[], float] = time.time,
        count: Callable | None = None,
    ):
        self.reader, self.max_age_s, self.clock = reader, max_age_s, clock
        self.count = count or _count_state  # (spark, checkpoint_dir, as_of_ms) -> PendingCounts
        self._lock = threading.Lock()
        self._result: dict | None = None
        self._computed_at: float | None = None
        self._error: str | None = None
        self._worker: threading.Thread | None = None
        self._read_s = 0.0  # how long the last read took

    def counted(self) -> tuple[int, int | None, float] | None:
        """(schedules not yet due, the earliest due time in ms or None, as of in s) of the last read, or None."""
        with self._lock:
            result = self._result
        if result is None:
            return None
        return result["total"] - result["due_not_retired"], result["earliest_due_ms"], result["as_of_ms"] / 1000

    def get(self) -> dict:
        now = self.clock()
        with self._lock:
            max_age = max(self.max_age_s, STATE_READ_SPACING * self._read_s)
            stale = self._computed_at is None or now - self._computed_at > max_age
            computing = self._worker is not None and self._worker.is_alive()
            if stale and not computing and self.reader.ready:
                self._worker = threading.Thread(target=self._compute, name="status-page-upcoming", daemon=True)
                self._worker.start()
                computing = True
            result, computed_at, error = self._result, self._computed_at, self._error
        if result is None:
            state = "error" if error and not computing else "computing" if self.reader.ready else "waiting"
            return {
                "state": state,
                "computing": computing,
                "error": error,
                "reason": {
                    "computing": "reading the state store (the first read takes a few seconds)",
                    "waiting": "the job's Spark session is starting",
                    "error": "the last read failed; the next request tries again",
                }[state],
            }
        return {
            "state": "ready",
            **result,
            "age_s": round(now - computed_at, 1),
            "computing": computing,
            "error": error,
        }

    def _compute(self) -> None:
        started = time.monotonic()
        try:
            as_of_ms = int(self.clock() * 1000)
            result = self.reader.run(
                lambda spark, checkpoint_dir, batch: upcoming_json(
                    self.count(spark, checkpoint_dir, as_of_ms), as_of_ms, batch
                ),
                empty=lambda: upcoming_json(PendingCounts(), as_of_ms, None),
            )
            if result is None:
                return
            read_s = time.monotonic() - started
            with self._lock:
                self._result, self._computed_at, self._error, self._read_s = result, as_of_ms / 1000, None, read_s
            log.debug("status page: upcoming counts read in %.1fs", read_s)
        except Exception as exc:  # the page shows it; the next request tries again
            message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            log.warning("status page: reading the state store failed: %s", message)
            with self._lock:
                self._error = message
                self._computed_at = self.clock()  # not again at once: after max_age_s
