"""Outcome counts: one summary per micro-batch (the log line) and running totals since start."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from ..contract import BATCH_TIME, DELIVERED_AT_ONCE, INDEX_ENTRIES_PREFIX, LABEL_SEPARATOR, SKIPPED_FIRINGS


class EarlyTally(NamedTuple):
    """A batch's share of the early path (``TimedWriter.take_written_early``): the deliveries written early, and the
    batch's own rows of the versions written early, which it left out but its summary counted: as deliveries, as
    expired (its state found the request past its max lateness) or as dead letters."""

    written: int = 0
    delivered_again: int = 0
    expired_again: int = 0
    dead_lettered_again: int = 0

    def plus(self, counted: str | None) -> EarlyTally:
        return self._replace(**{counted: getattr(self, counted) + 1}) if counted else self


@dataclass
class BatchSummary:
    batch_id: int
    outcomes: Counter = field(default_factory=Counter)  # one per request: scheduled, replaced, ..., rejected
    delivered: int = 0  # records written to destination topics
    held: int = 0  # of those, how many were prepared ahead and held until their due time
    prepared_deliveries: int = 0  # deliveries emitted ahead of their due time (see held)
    prepared_records: int = 0  # records of prepared deliveries (with their write-backs and history copies)
    withdrawn: int = 0  # prepared deliveries of earlier batches withdrawn before they were written
    dead_lettered: int = 0  # deliveries diverted to the rejections topic (destination missing)
    written_back: int = 0  # write-backs sent to source topics (Karafka, ETF1, Sky inputs)
    earliest_due_ms: int | None = None  # of the deliveries in this batch, for the lateness figure
    latest_prepared_due_ms: int | None = None  # of the deliveries it prepared (prepared_horizon.py)
    written_at_ms: int = 0
    compute_s: float = 0.0  # decode, state step and summary (the batch's first Spark job)
    write_s: float = 0.0  # the Kafka write
    index_entries: dict = field(default_factory=dict)  # shard -> id index entries, the shard's last report
    # (outcome, input topic, reason class or "") -> n: the outcomes again, with the labels the metrics use
    labelled: Counter = field(default_factory=Counter)
    at_once: Counter = field(default_factory=Counter)  # input topic -> schedules delivered at once (due when read)
    # deliveries the batch wrote itself through Spark's Kafka sink (not the timed writer, nor a herd it handed on)
    written_by_batch: int = 0
    batch_time_ms: int | None = None  # the processing time of the state's rules (None: no shard ran)
    expired: int = 0  # deliveries later than their max lateness: rejected as expired instead (by the batch)
    skipped: int = 0  # firings of skip crons missed while the job was down
    # deliveries the timed writer wrote since the last batch from requests read as they arrived (counted in delivered)
    written_early: int = 0

    def count_early(self, early: EarlyTally) -> None:
        """What the early path did since the last batch: its deliveries counted, and this batch's rows of versions
        it wrote, which the batch left out, taken back from what the batch counted them as. A dead letter is taken
        from the deliveries too: the batch's deliveries count it until the dead letters are taken from them."""
        self.written_early = early.written
        self.delivered += early.written - early.delivered_again - early.dead_lettered_again
        self.dead_lettered -= early.dead_lettered_again
        self.expired -= early.expired_again

    def count_outcome(self, topic: str, n: int, last_n: int | None = None) -> None:
        """An outcome row group: ``n`` summed over the batch, ``last_n`` the value of its latest row."""
        if topic == BATCH_TIME:
            self.batch_time_ms = int(n if last_n is None else last_n)
            return
        if topic == SKIPPED_FIRINGS:
            self.skipped += int(n)
            return
        if topic.startswith(INDEX_ENTRIES_PREFIX):
            self.index_entries[int(topic[len(INDEX_ENTRIES_PREFIX) :])] = int(n if last_n is None else last_n)
            return
        name, *labels = topic.split(LABEL_SEPARATOR)
        if name == DELIVERED_AT_ONCE:
            self.at_once[labels[0] if labels else ""] += n
            return
        self.outcomes[name] += n
        labels = (labels + ["", ""])[:2]
        self.labelled[(name, *labels)] += n

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def busy(self) -> bool:
        return bool(
            self.outcomes
            or self.delivered
            or self.written_early
            or self.dead_lettered
            or self.withdrawn
            or self.expired
            or self.skipped
        )

    def log_line(self) -> str:
        parts = [f"batch {self.batch_id}:"]
        if self.requests:
            detail = ", ".join(f"{n} {name}" for name, n in sorted(self.outcomes.items()))
            parts.append(f"{self.requests} requests ({detail});")
        parts.append(f"{self.delivered} delivered")
        if self.held:
            parts.append(f"({self.held} held until due)")
        if self.written_early:
            parts.append(f"({self.written_early} written as their requests were read)")
        if self.withdrawn:
            parts.append(f"({self.withdrawn} withdrawn before their due time)")
        if self.delivered and self.earliest_due_ms is not None:
            parts.append(f"(max lateness {max(0, self.written_at_ms - self.earliest_due_ms) / 1000:.2f}s)")
        if self.written_back:
            parts.append(f"({self.written_back} written back)")
        if self.dead_lettered:
            parts.append(f"; {self.dead_lettered} undeliverable, sent to rejections")
        if self.expired:
            parts.append(f"; {self.expired} expired (later than their max lateness), sent to rejections")
        if self.skipped:
            parts.append(f"; {self.skipped} cron firings missed while the job was down, skipped")
        parts.append(f"[state {self.compute_s:.2f}s, write {self.write_s:.2f}s]")
        return " ".join(parts)


class Totals:
    """Running counts since the process started (later exported as Prometheus counters)."""

    def __init__(self) -> None:
        self.outcomes: Counter = Counter()
        self.delivered = 0
        self.dead_lettered = 0
        self.written_back = 0
        self.expired = 0
        self.skipped = 0
        self.batches = 0
        self.started = time.time()
        self.index_entries: dict = {}  # shard -> its last reported index size

    @property
    def index_total(self) -> int | None:
        return sum(self.index_entries.values()) if self.index_entries else None

    def add(self, summary: BatchSummary) -> None:
        self.outcomes.update(summary.outcomes)
        self.delivered += summary.delivered - summary.withdrawn
        self.dead_lettered += summary.dead_lettered
        self.written_back += summary.written_back
        self.expired += summary.expired
        self.skipped += summary.skipped
        self.index_entries.update(summary.index_entries)
        self.batches += 1
