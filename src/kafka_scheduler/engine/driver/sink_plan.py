"""The record sink's decisions, free of Spark jobs (record_sink.py takes them on what its Spark jobs return): what a
batch's summary job says, what its destinations would refuse, where its prepared deliveries go, and which batch is a
graceful stop's last and what it writes. tests/unit/test_sink_plan.py checks them without a Spark session."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ...kafka.topics import Destination
from ..contract import (
    KIND_DELIVER,
    KIND_EXPIRED,
    KIND_HISTORY,
    KIND_OUTCOME,
    KIND_REJECT,
    KIND_TIMER,
    KIND_WITHDRAW,
    KIND_WRITE_BACK,
    OUTCOME_REJECTED,
)
from .batch_summary import BatchSummary
from .producing import PRODUCER_MAX_BYTES

# A record's bytes in a record batch beyond its key, value and header bytes, with room to spare: the batch
# header (61 bytes), the record's and each header's varints, lz4's frame and a 4-byte header per 64 KiB block.
RECORD_FRAMING_BYTES = 128
HEADER_FRAMING_BYTES = 10


def framed_bytes(payload: int) -> int:
    """The most a record can take in a record batch, from its ``payload_bytes`` (which count header framing)."""
    return payload + RECORD_FRAMING_BYTES + payload // 8192


# ---------------------------------------------------------------- the summary job's rows


@dataclass
class BatchDigest:
    """A batch's summary job, read: the summary, and what the sink's writes need besides."""

    summary: BatchSummary
    per_topic: Counter = field(default_factory=Counter)  # deliveries per destination topic
    largest: dict[str, int] = field(default_factory=dict)  # per topic: its largest delivery (key, value, headers)
    # per topic whose deliveries name partitions: the highest they name (-1 when they only name partition keys)
    partitioned: dict[str, int] = field(default_factory=dict)
    timers: list[int] = field(default_factory=list)  # timer instants the state armed
    withdrawn: list[str] = field(default_factory=list)  # delivery ids the state withdrew
    expiry_deadline: int | None = None  # the earliest due + max lateness of what the batch writes
    copies: set[str] = field(default_factory=set)  # which of write-backs and history copies its records have


def digest(rows: Iterable[Mapping], batch_id: int) -> BatchDigest:
    """The summary job's rows (one per kind and topic: record_sink's summary columns) as the batch's digest."""
    read = BatchDigest(BatchSummary(batch_id))
    summary = read.summary
    for row in rows:
        kind = row["kind"]
        if row["write_backs"] and kind in (KIND_DELIVER, KIND_REJECT, KIND_EXPIRED):
            read.copies.add(KIND_WRITE_BACK)
        if kind == KIND_TIMER:
            read.timers.extend(row["timers"])
        elif kind == KIND_WITHDRAW:
            read.withdrawn.extend(row["withdrawn"])
        elif kind == KIND_OUTCOME:
            summary.count_outcome(row["topic"], row["n"], row["last_n"])
        elif kind == KIND_EXPIRED:
            summary.expired += row["records"]
        elif kind == KIND_DELIVER:
            if row["deadline"] is not None:
                read.expiry_deadline = (
                    row["deadline"] if read.expiry_deadline is None else min(read.expiry_deadline, row["deadline"])
                )
            summary.delivered += row["records"]
            summary.written_back += row["write_backs"]
            if row["history_copies"]:
                read.copies.add(KIND_HISTORY)
            topic = row["topic"]
            read.per_topic[topic] += row["records"]
            read.largest[topic] = max(read.largest.get(topic, 0), row["largest"] or 0)
            if row["max_partition"] is not None or row["hashed"]:
                read.partitioned[topic] = -1 if row["max_partition"] is None else row["max_partition"]
            summary.prepared_records += row["prepared_records"] or 0
            if row["latest_prepared_due"] is not None:
                summary.latest_prepared_due_ms = max(summary.latest_prepared_due_ms or 0, row["latest_prepared_due"])
            summary.prepared_deliveries += row["prepared_deliveries"] or 0
            if row["earliest_due"] is not None and (
                summary.earliest_due_ms is None or row["earliest_due"] < summary.earliest_due_ms
            ):
                summary.earliest_due_ms = row["earliest_due"]
    return read


# ---------------------------------------------------------------- what the destinations would refuse


@dataclass
class Refusals:
    """What a batch's destinations would refuse: the sink turns those deliveries into rejections."""

    missing: set = field(default_factory=set)  # topics that do not exist
    denied: set = field(default_factory=set)  # topics the broker does not let the scheduler write to
    oversize: dict = field(default_factory=dict)  # topic -> (largest framed record it takes, why) if one is larger
    counts: dict = field(default_factory=dict)  # partition counts of the topics deliveries name partitions of
    rejection_limit: int = PRODUCER_MAX_BYTES  # the largest framed record the rejections topic takes

    @property
    def any(self) -> bool:
        return bool(self.missing or self.denied or self.oversize)

    def of_topics(self, per_topic: Counter) -> int:
        """How many deliveries their topic refuses whole (missing or not writable)."""
        return sum(per_topic[t] for t in self.missing | self.denied)

    def beyond(self, partitioned: dict[str, int]) -> dict[str, int]:
        """The topics some delivery names a partition of that does not exist, with their partition counts."""
        return {t: n for t, n in self.counts.items() if partitioned.get(t, -1) >= n}


def record_payload_bytes(key: bytes | None, value: bytes | None, headers: Iterable[tuple[str, bytes | None]]) -> int:
    """``sink_columns.payload_bytes`` of one record in Python: key, value, header names and values and framing."""
    return (
        len(key or b"")
        + len(value or b"")
        + sum(len(name.encode()) + len(header or b"") + HEADER_FRAMING_BYTES for name, header in headers)
    )


def takes_at_once(destination: Destination | None, payload: int) -> bool:
    """Whether a record of ``payload`` bytes can be written to a destination known from an earlier look-up, with
    nothing for the sink to refuse (a destination not looked up yet, missing, not writable, or with a smaller
    record limit: a batch's to write, or to turn into a rejection)."""
    return destination is not None and destination.writable and framed_bytes(payload) <= record_limit(destination)[0]


def record_limit(destination: Destination) -> tuple[int, str]:
    """The largest framed record a topic takes, and why: its max.message.bytes or the producers' own limit."""
    if destination.max_message_bytes is not None and destination.max_message_bytes < PRODUCER_MAX_BYTES:
        return destination.max_message_bytes, f"max.message.bytes {destination.max_message_bytes}"
    return PRODUCER_MAX_BYTES, f"the scheduler writes records of at most {PRODUCER_MAX_BYTES} bytes"


def refusals_of(
    per_topic: Counter,
    largest: dict[str, int],
    partitioned: dict[str, int],
    known: Mapping[str, Destination],
    rejections_topic: str,
) -> Refusals:
    """What the destinations of a batch's deliveries would refuse, from the broker's metadata (``known``: the
    destinations that exist, the rejections topic among them)."""
    destinations = {t: d for t, d in known.items() if t in per_topic}
    refusals = Refusals(
        missing=set(per_topic) - destinations.keys(), denied={t for t, d in destinations.items() if not d.writable}
    )
    for topic, destination in destinations.items():
        limit = record_limit(destination)
        if destination.writable and framed_bytes(largest.get(topic) or 0) > limit[0]:
            refusals.oversize[topic] = limit
    refusals.counts = {t: d.partitions for t, d in destinations.items() if t in partitioned and d.writable}
    rejections = known.get(rejections_topic)
    refusals.rejection_limit = record_limit(rejections)[0] if rejections is not None else PRODUCER_MAX_BYTES
    return refusals


# ---------------------------------------------------------------- where the records go


def due_now_records(summary: BatchSummary, refusals: Refusals, partitioned: dict[str, int]) -> int:
    """How many records a batch writes at once (deliveries due now, rejections, expired ones and write-backs; at
    least one when it has any, or when dead letters or partitions may turn up): the room they take in the timed
    writer beside the prepared ones."""
    due_now = (
        summary.delivered - summary.prepared_deliveries + summary.outcomes.get(OUTCOME_REJECTED, 0) + summary.expired
    )
    return max(1, due_now + summary.written_back) if due_now or refusals.any or partitioned else 0


def all_to_timed_writer(prepared_records: int, due_now: int, room: int) -> bool:
    """Whether the timed writer takes all of a batch's records (the usual batch): it writes what is due now at once,
    a Kafka write job less. What is due now counts twice."""
    return prepared_records + 2 * due_now <= room


@dataclass(frozen=True)
class SliceLoad:
    """A slice of a batch's prepared records (herd_writer's slices of due time)."""

    number: int
    records: int  # deliveries, write-backs and history copies
    deliveries: int
    deadline: int | None  # the earliest due + max lateness in it


def route_slices(slices: Iterable[SliceLoad], room: int) -> tuple[list[SliceLoad], list[SliceLoad]]:
    """Prepared records beyond the timed writer's room, per slice: the smallest slices (ordinary deliveries prepared
    beside a herd) to the timed writer while it has room, the rest (the herd) to the herd writer. Returns (to the
    timed writer, to the herd writer)."""
    ordered = sorted(slices, key=lambda s: s.records)
    small: list[SliceLoad] = []
    for piece in ordered:
        if piece.records > room:
            break
        small.append(piece)
        room -= piece.records
    return small, ordered[len(small) :]


# ---------------------------------------------------------------- a graceful stop


def refuses_batch(final_batch: int | None, stop_requested: bool, has_timed_writer: bool) -> bool:
    """Whether the sink refuses a batch (it raises before writing anything: the batch is not committed, the next run
    does it again): once a graceful stop's final batch ran, or once a stop is asked for without a timed writer (then
    nothing is written outside the batches, and the batch in flight was the last)."""
    return final_batch is not None or (stop_requested and not has_timed_writer)


def is_final(stop_at_ms: int | None, batch_time_ms: int | None) -> bool:
    """Whether a batch is a graceful stop's last: the first whose rules ran at or after the stop's instant (it writes
    what is due by its time, retires all of it from state, and writes nothing prepared)."""
    return stop_at_ms is not None and batch_time_ms is not None and batch_time_ms >= stop_at_ms


def written_by_ms(final: bool, batch_time_ms: int | None, started_ms: int, stop_at_ms: int | None) -> int:
    """The instant up to which a batch waits for the writers before it commits: what it retires from state must be
    written. Its start; stopping, the stop's instant if earlier (the writers write nothing due after it); the final
    batch, its own time (what is due by then is written at once: late by less than a batch, never early)."""
    if final:
        return batch_time_ms
    return started_ms if stop_at_ms is None else min(started_ms, stop_at_ms)


def leave_prepared_out(summary: BatchSummary) -> None:
    """The final batch writes nothing prepared (the state keeps it: the next run emits it again): its counts."""
    summary.delivered -= summary.prepared_deliveries
    summary.prepared_records = summary.prepared_deliveries = 0
