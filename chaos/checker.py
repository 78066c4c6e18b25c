"""Judges the crash suite's outcome: the deliveries read from the destination topics against the request log.
Pure (no Kafka, no Spark), so its rules are unit-tested on hand-made logs.

The rule for "in time". The job promises that a replace or cancel takes effect if it processed it before the
due instant of the version it supersedes (docs/design.md, "Timed writer"). The suite cannot see when a batch
started, but it watches the checkpoint: ``committed_ms`` is the first time it saw a committed batch whose end
offsets cover the request. A batch commits after it ran, so a request committed before the due time was
certainly processed before it: the superseded version must then not be delivered. A request not seen
committed before the due time (the job was down, or the broker) may or may not have come in time: the old
version may be delivered, and that is counted (``superseded_late``), not failed. The version an id ends with
(its last request, when that is not a cancel) must be delivered whatever happened before.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

DELIVERY_ID = "x-scheduler-delivery-id"

# Figures that fail the run when not zero.
# A version first delivered within this long after its due time was held by the timed writer and written at its
# instant: the deliveries by which "never early" is exercised (a writer writing early would have made them early).
ON_TIME_MS = 100

VIOLATIONS = (
    "lost",
    "early",
    "cancelled_delivered",
    "stale_version",
    "wrong_content",
    "unknown_delivery",
    "missing_delivery_id",
    "duplicate_id_mismatch",
)


@dataclass(frozen=True)
class Sent:
    """One request as the suite sent it."""

    sid: str
    seq: int  # order among the requests of ``sid``
    action: str  # "schedule", "replace" or "cancel"
    version: str | None = None  # None for a cancel
    due_ms: int | None = None  # the due time the scheduler reads from the request (dialect rounding applied)
    key: bytes | None = None  # what a delivery of this version carries
    value: bytes | None = None
    committed_ms: int | None = None  # first seen covered by a committed batch; None: never seen


@dataclass(frozen=True)
class Delivery:
    key: bytes | None
    value: bytes | None
    appended_ms: int  # the broker's append time (destination topics use LogAppendTime)
    delivery_id: bytes | None
    where: str = ""  # topic-partition@offset, for the examples in the report


def version_of(value: bytes | None) -> tuple[str, str] | None:
    """(sid, version) of a delivered value written by ``value_for``; None for anything else."""
    if not value:
        return None
    parts = value.split(b"|", 2)
    if len(parts) != 3:
        return None
    try:
        return parts[0].decode(), parts[1].decode()
    except UnicodeDecodeError:
        return None


def value_for(sid: str, version: str, padding: int) -> bytes:
    return f"{sid}|{version}|".encode() + b"." * padding


@dataclass
class Verdict:
    figures: dict
    examples: dict = field(default_factory=dict)  # violation -> a few cases, for the report
    expect_no_duplicates: bool = False

    @property
    def failures(self) -> dict:
        names = VIOLATIONS + (("duplicates",) if self.expect_no_duplicates else ())
        return {name: self.figures[name] for name in names if self.figures.get(name)}

    @property
    def ok(self) -> bool:
        return not self.failures


def check(
    sent: Iterable[Sent], deliveries: Iterable[Delivery], expect_no_duplicates: bool = False, examples_per_kind: int = 5
) -> Verdict:
    by_sid: dict[str, list[Sent]] = defaultdict(list)
    for request in sent:
        by_sid[request.sid].append(request)
    versions: dict[tuple[str, str], Sent] = {}
    forbidden: dict[tuple[str, str], str] = {}  # version -> "cancelled_delivered" / "stale_version"
    required: set[tuple[str, str]] = set()
    superseded_late: set[tuple[str, str]] = set()
    cancelled = 0
    for sid, requests in by_sid.items():
        requests.sort(key=lambda r: r.seq)
        for i, request in enumerate(requests):
            if request.action == "cancel":
                continue
            key = (sid, request.version)
            versions[key] = request
            after = requests[i + 1] if i + 1 < len(requests) else None
            if after is None:
                required.add(key)
            elif after.committed_ms is not None and after.committed_ms < request.due_ms:
                forbidden[key] = "cancelled_delivered" if after.action == "cancel" else "stale_version"
            else:
                superseded_late.add(key)
        cancelled += requests[-1].action == "cancel"

    examples: dict[str, list] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)

    def violation(kind: str, case) -> None:
        counts[kind] += 1
        if len(examples[kind]) < examples_per_kind:
            examples[kind].append(case)

    delivered: dict[tuple[str, str], list[Delivery]] = defaultdict(list)
    total = 0
    for delivery in deliveries:
        total += 1
        if delivery.delivery_id is None:
            violation("missing_delivery_id", delivery.where)
        key = version_of(delivery.value)
        request = versions.get(key) if key else None
        if request is None:
            violation("unknown_delivery", {"where": delivery.where, "value": repr(delivery.value)[:80]})
            continue
        delivered[key].append(delivery)
        if delivery.key != request.key or delivery.value != request.value:
            violation("wrong_content", {"sid": key[0], "version": key[1], "where": delivery.where})
        if delivery.appended_ms < request.due_ms:
            violation(
                "early",
                {
                    "sid": key[0],
                    "version": key[1],
                    "due_ms": request.due_ms,
                    "appended_ms": delivery.appended_ms,
                    "where": delivery.where,
                },
            )
        if key in forbidden:
            after = by_sid[key[0]][by_sid[key[0]].index(request) + 1]
            violation(
                forbidden[key],
                {
                    "sid": key[0],
                    "version": key[1],
                    "due_ms": request.due_ms,
                    "superseded_committed_ms": after.committed_ms,
                    "where": delivery.where,
                },
            )

    lateness_ms = sorted(
        min(c.appended_ms for c in delivered[key]) - versions[key].due_ms for key in required if key in delivered
    )

    def quantile(fraction: float) -> float | None:
        return (
            round(lateness_ms[min(len(lateness_ms) - 1, int(fraction * len(lateness_ms)))] / 1000, 3)
            if lateness_ms
            else None
        )

    duplicates = 0
    for key, copies in delivered.items():
        duplicates += len(copies) - 1
        if len({c.delivery_id for c in copies}) > 1:
            violation(
                "duplicate_id_mismatch",
                {"sid": key[0], "version": key[1], "delivery_ids": sorted({repr(c.delivery_id) for c in copies})},
            )
    for key in sorted(required):
        if key not in delivered:
            violation("lost", {"sid": key[0], "version": key[1], "due_ms": versions[key].due_ms})

    figures = {
        "schedules": len(by_sid),
        "requests": sum(len(r) for r in by_sid.values()),
        "cancelled": cancelled,
        "expected": len(required),
        "deliveries_read": total,
        "delivered": sum(1 for key in required if key in delivered),
        "superseded_late": len(superseded_late),
        "superseded_late_delivered": sum(1 for key in superseded_late if key in delivered),
        "on_time": sum(1 for late in lateness_ms if 0 <= late < ON_TIME_MS),
        "lateness_p50_s": quantile(0.5),
        "lateness_p99_s": quantile(0.99),
        "duplicates": duplicates,
        **{name: counts.get(name, 0) for name in VIOLATIONS},
    }
    return Verdict(figures, dict(examples), expect_no_duplicates)
