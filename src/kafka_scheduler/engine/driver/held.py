"""What the timed writer holds (``Held``: a delivery with its write-back and history copies, at its due time), what
makes two versions of an id identical, and how a batch's summary counted a row the writer leaves out."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...protocol import DELIVERY_ID, REJECTION_REASON
from ..contract import KIND_DELIVER, KIND_REJECT, WriterRow
from ..rules.rejection_classes import EXPIRED, REFUSED_BY_DESTINATION, reason_class
from .early_book import Content
from .early_cancels import Arrival
from .early_requests import EarlyRequest
from .producing import Record, header_pairs


@dataclass(order=True)
class Held:
    due_ms: int
    delivery_id: str
    records: list[Record] = field(compare=False)  # the delivery, its write-back and history copy
    kinds: list = field(default_factory=list, compare=False)  # the kind of each record (KIND_DELIVER, ...)
    max_lateness_ms: int | None = field(default=None, compare=False)  # written later than due + this: expired
    sid: bytes | None = field(default=None, compare=False)  # the schedule's id in the state (a one-shot's: id:...)
    # Held early, from a request read before a batch applied it: the request, until a batch hands the version over
    early: Arrival | None = field(default=None, compare=False)

    def record_kinds(self) -> list:
        return self.kinds + [KIND_DELIVER] * (len(self.records) - len(self.kinds))

    def expired_at(self, now_ms: int) -> bool:
        return self.max_lateness_ms is not None and self.due_ms > 0 and now_ms - self.due_ms > self.max_lateness_ms

    def content(self) -> Content | None:
        """What makes it identical to another version of its id (early_book.Content): its delivery record less the
        delivery id."""
        for record, kind in zip(self.records, self.record_kinds()):
            if kind == KIND_DELIVER:
                headers = tuple((name, value) for name, value in record.headers if name != DELIVERY_ID)
                return (
                    self.due_ms,
                    record.topic,
                    record.partition,
                    record.key,
                    record.value,
                    headers,
                    self.max_lateness_ms,
                )
        return None


# How a batch's summary counts a delivery's row, by the class of a rejection's reason
_COUNTED_AS_REJECTED = {EXPIRED: "expired_again", REFUSED_BY_DESTINATION: "dead_lettered_again"}


def counted_as(row: WriterRow) -> str | None:
    """The ``EarlyTally`` field a batch's row counts in: a delivery, or a delivery the batch turned into a rejection
    (expired, or refused by its destination); None for a write-back or history copy, which no count names."""
    if row.kind == KIND_DELIVER:
        return "delivered_again"
    if row.kind != KIND_REJECT:
        return None
    reason = next((value for name, value in header_pairs(row.headers) if name == REJECTION_REASON), None)
    return _COUNTED_AS_REJECTED.get(reason_class(reason))


def early_content(request: EarlyRequest) -> Content:
    return (
        request.due_ms,
        request.topic,
        None,
        request.key,
        request.value,
        request.headers,
        request.max_lateness_ms,
    )


def kind_of(held: Held, record: tuple) -> str:
    for candidate, kind in zip(held.records, held.record_kinds()):
        if candidate is record:
            return kind
    return KIND_DELIVER
