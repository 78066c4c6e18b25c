"""The job's Prometheus metrics: one registry fed by the batch summaries (engine/driver/record_sink.py), the timed
writer's writes and the input lag watcher (input_lag.py), served at /metrics on the metrics port (http_server.py).

The values live in ``SchedulerMetrics.registry``: the status page reads the same registry, so the page and a scrape
never disagree. What the page shows beyond the counters (lateness over the last hour, the last rejections) is fed
here too, by the same calls (recent.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..engine.contract import OUTCOME_REJECTED
from ..engine.driver.batch_summary import BatchSummary
from ..engine.rules.rejection_classes import EXPIRED, REFUSED_BY_DESTINATION
from .recent import LatenessWindow, RecentRejections

log = logging.getLogger(__name__)

PREFIX = "kafka_scheduler_"
# Seconds: a delivery a few ms late is the rule with the timed writer; a batch of a herd may take minutes.
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
BATCH_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class SchedulerMetrics:
    """Every metric the job exports. ``dialects``: input topic -> dialect, for the ``dialect`` label."""

    def __init__(self, dialects: dict[str, str], registry: CollectorRegistry | None = None):
        self.dialects = dict(dialects)
        self.registry = registry = registry if registry is not None else CollectorRegistry()
        by_input = ["input_topic", "dialect"]
        self.requests = Counter(
            PREFIX + "requests",
            "Requests read, by outcome: scheduled, replaced, replace_noop, "
            "cancelled, cancel_noop, completed, complete_noop, and for crons cron_added, "
            "cron_replaced, cron_replace_noop, cron_paused, cron_pause_noop, cron_resumed, "
            "cron_resume_noop, cron_cancelled, cron_cancel_noop (rejected ones: "
            "kafka_scheduler_rejected_total)",
            ["outcome", *by_input],
            registry=registry,
        )
        self.rejected = Counter(
            PREFIX + "rejected",
            "Requests rejected (sent to the rejections topic), by reason class",
            [*by_input, "reason_class"],
            registry=registry,
        )
        self.delivered = Counter(
            PREFIX + "delivered", "Deliveries written to their destination topics", registry=registry
        )
        self.delivered_at_once = Counter(
            PREFIX + "delivered_at_once",
            "Schedules already due when their request was read, delivered by the batch that read it",
            by_input,
            registry=registry,
        )
        self.written_back = Counter(
            PREFIX + "written_back",
            "Write-backs emitted to source topics (Karafka, ETF1, Sky inputs) with their deliveries",
            registry=registry,
        )
        self.dead_lettered = Counter(
            PREFIX + "dead_lettered",
            "Deliveries their destination refused (topic or "
            "partition missing, not authorized, too large), sent to the rejections topic",
            registry=registry,
        )
        self.expired = Counter(
            PREFIX + "expired",
            "Deliveries (one-shots and cron firings) that would have gone out "
            "later than their due time plus their x-scheduler-max-lateness, sent to the rejections "
            "topic as expired instead",
            registry=registry,
        )
        self.keyed_apart = Counter(
            PREFIX + "requests_keyed_apart",
            "Native requests of an id that arrived in another partition than the id's request before them (another "
            "record key): the broker's timestamps order them, not offsets",
            registry=registry,
        )
        self.early_read_behind = Gauge(
            PREFIX + "early_read_behind_seconds",
            "How far the read of the native inputs as they arrive (CANCELs and requests due soon act from it) is "
            "behind: now minus the broker timestamp of the newest record it read, 0 when it has read everything",
            registry=registry,
        )
        self.skipped_firings = Counter(
            PREFIX + "skipped_firings",
            "Firings of crons with the skip policy that were due while the job was down, not delivered",
            registry=registry,
        )
        self.pending = Gauge(
            PREFIX + "pending_schedules",
            "Pending schedules with a request id (the id index, "
            "summed over shards, after every batch; schedules without id are not counted: see "
            "kafka_scheduler_counted_pending_schedules)",
            registry=registry,
        )
        # Counted from the checkpoint by a state read that a scrape (or the status page) starts when the last is
        # stale (upcoming.UpcomingCache): NaN until the first read.
        self.counted_pending = Gauge(
            PREFIX + "counted_pending_schedules",
            "All pending schedules not yet due (with "
            "or without id), counted from the checkpoint's last committed batch at "
            "kafka_scheduler_counted_timestamp_seconds",
            registry=registry,
        )
        self.earliest_due = Gauge(
            PREFIX + "earliest_pending_due_timestamp_seconds",
            "The earliest due time of the pending schedules not yet due, from the same count (0: none)",
            registry=registry,
        )
        self.counted_at = Gauge(
            PREFIX + "counted_timestamp_seconds",
            "When the pending schedules were last counted "
            "from the checkpoint (a scrape starts a recount once the count is older than 30 s, "
            "or 20 times the last count's duration)",
            registry=registry,
        )
        self.follow_state_counts(lambda: None)
        self.next_wakeup = Gauge(
            PREFIX + "next_wakeup_timestamp_seconds",
            "When the job next acts on pending "
            "schedules (the earliest armed timer, up to --lookahead plus a preparation lead "
            "before the earliest due time); 0: none armed",
            registry=registry,
        )
        self.lateness = Histogram(
            PREFIX + "delivery_lateness_seconds",
            "How long after its due time each delivery was written",
            buckets=LATENESS_BUCKETS,
            registry=registry,
        )
        self.batch_duration = Histogram(
            PREFIX + "batch_duration_seconds",
            "Micro-batch time in the sink: state step, summary and Kafka write",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batches = Counter(PREFIX + "batches", "Micro-batches completed", registry=registry)
        self.last_batch = Gauge(
            PREFIX + "last_batch_timestamp_seconds", "When the last micro-batch completed", registry=registry
        )
        self.input_lag = Gauge(
            PREFIX + "input_lag_records",
            "Records in an input topic partition the job has not "
            "read yet (latest offset minus the end offset of the last batch)",
            ["topic", "partition"],
            registry=registry,
        )
        self._lock = threading.Lock()
        self._index_entries: dict[int, int] = {}
        self.recent_lateness = LatenessWindow()
        self.recent_rejections = RecentRejections()

    def value(self, name: str, labels: dict | None = None) -> float | None:
        """A sample's current value (``name`` as exposed, e.g. ``kafka_scheduler_delivered_total``)."""
        return self.registry.get_sample_value(name, labels or {})

    def dialect_of(self, topic: str) -> str:
        return self.dialects.get(topic, "")

    def follow_state_counts(self, counted: Callable[[], tuple | None]) -> None:
        """``counted()``: (schedules not yet due, earliest due in ms or None, as of in s) or None, read at scrape."""
        nan = float("nan")
        self.counted_pending.set_function(lambda: nan if (c := counted()) is None else c[0])
        self.earliest_due.set_function(lambda: nan if (c := counted()) is None else (c[1] or 0) / 1000)
        self.counted_at.set_function(lambda: nan if (c := counted()) is None else c[2])

    def follow_next_wakeup(self, next_ms: Callable[[], int | None]) -> None:
        """Read at each scrape: the driver's next wake-up instant (ms) moves between batches too."""
        self.next_wakeup.set_function(lambda: (next_ms() or 0) / 1000)

    def record_batch(self, summary: BatchSummary) -> None:
        """A committed batch's outcome counts (record_sink.RecordSink calls back with its summary)."""
        at_s = summary.written_at_ms / 1000 if summary.written_at_ms else time.time()
        for (outcome, topic, reason), n in summary.labelled.items():
            if not n:
                continue
            if outcome == OUTCOME_REJECTED:
                self.rejected.labels(topic, self.dialect_of(topic), reason or "other").inc(n)
                self.recent_rejections.add(at_s, topic, self.dialect_of(topic), reason or "other", n)
            else:
                self.requests.labels(outcome, topic, self.dialect_of(topic)).inc(n)
        for topic, n in summary.at_once.items():
            if n:
                self.delivered_at_once.labels(topic, self.dialect_of(topic)).inc(n)
        self.written_back.inc(summary.written_back)
        self._dead_lettered(summary.dead_lettered, at_s)
        self._expired(summary.expired, at_s)
        self.skipped_firings.inc(summary.skipped)
        if summary.written_by_batch:
            # Written by the batch itself with Spark (no timed writer, or beside a herd): observed at the batch's
            # largest lateness, the only figure the batch has.
            self.delivered.inc(summary.written_by_batch)
            if summary.earliest_due_ms is not None:
                self._observe_lateness(
                    max(0, summary.written_at_ms - summary.earliest_due_ms) / 1000,
                    min(summary.written_by_batch, 10_000),
                )
        with self._lock:
            self._index_entries.update(summary.index_entries)
            if self._index_entries:
                self.pending.set(sum(self._index_entries.values()))
        self.batch_duration.observe(summary.compute_s + summary.write_s)
        self.batches.inc()
        self.last_batch.set(at_s)

    def record_keyed_apart(self, requests: int) -> None:
        self.keyed_apart.inc(requests)

    def record_early_read_behind(self, seconds: float) -> None:
        self.early_read_behind.set(max(0.0, seconds))

    def record_written(self, lateness_ms: list[int], refused: int, expired: int = 0) -> None:
        """The timed writer wrote deliveries (``lateness_ms``: one per delivery), diverted ``refused`` records, and
        ``expired`` deliveries later than their max lateness."""
        self.delivered.inc(len(lateness_ms))
        for late, n in Tally(lateness_ms).items():
            self._observe_lateness(max(0, late) / 1000, n)
        self._dead_lettered(refused, time.time())
        self._expired(expired, time.time())

    def record_herd_written(self, deliveries: int, lateness_ms: int) -> None:
        """The herd writer wrote a slice of ``deliveries`` (as handed), the last ``lateness_ms`` after its due time:
        observed at that lateness, like a batch's own writes."""
        self.delivered.inc(deliveries)
        self._observe_lateness(max(0, lateness_ms) / 1000, min(deliveries, 10_000))

    def _expired(self, n: int, at_s: float) -> None:
        self.expired.inc(n)
        if n:
            self.recent_rejections.add(at_s, None, "", EXPIRED, n)

    def _observe_lateness(self, seconds: float, n: int) -> None:
        for _ in range(n):
            self.lateness.observe(seconds)
        self.recent_lateness.add(seconds, n)

    def _dead_lettered(self, n: int, at_s: float) -> None:
        self.dead_lettered.inc(n)
        if n:
            # A destination refused them at delivery: no input topic to show, the request was accepted long ago.
            self.recent_rejections.add(at_s, None, "", REFUSED_BY_DESTINATION, n)

    def record_lag(self, end_offsets: dict, latest: dict) -> None:
        """``end_offsets``/``latest``: {(topic, partition): offset}; lag is reported where both are known."""
        for (topic, partition), end in end_offsets.items():
            if (topic, partition) in latest:
                self.input_lag.labels(topic, str(partition)).set(max(0, latest[(topic, partition)] - end))
