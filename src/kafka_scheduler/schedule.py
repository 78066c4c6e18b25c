"""The scheduling rules, free of Spark: what a request or a due timer does to one schedule id.

The Spark state processor (``state_processor``) drives these functions through the
``PendingStore`` interface; the unit and property tests drive them through an
in-memory store. Keeping the rules here means the state layout can change without
touching the semantics, and the semantics can be tested in milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Optional, Protocol

from .protocol import DELIVERY_ID

Headers = tuple[tuple[str, Optional[bytes]], ...]

# Schedule ids are bytes end to end (ids of the coming dialects are Kafka keys: any bytes), scoped
# by input topic: b"id:<topic>/<request id bytes>". Topic names cannot contain "/", so the
# form is unambiguous. An ADD without request id gets b"offset:<topic>/<partition>/<offset>":
# nothing can refer to it. Rejections share one grouping key of their own.
CLIENT_SID_PREFIX = b"id:"
INTERNAL_SID_PREFIX = b"offset:"
REJECTIONS_SID = b"\x00rejections"


def is_internal(sid: bytes) -> bool:
    return sid[:len(INTERNAL_SID_PREFIX)] == INTERNAL_SID_PREFIX



class Action(str, Enum):
    ADD = "ADD"
    REPLACE = "REPLACE"
    CANCEL = "CANCEL"
    COMPLETE = "COMPLETE"  # a write-back read back: the version it names was delivered


class Outcome(str, Enum):
    """Exactly one per valid request (rejections are counted by the decoder)."""

    SCHEDULED = "scheduled"  # nothing was pending under the id: stored (or delivered at once if due)
    REPLACED = "replaced"  # a pending version was swapped for this one
    REPLACE_NOOP = "replace_noop"  # identical to the pending version: nothing changes
    CANCELLED = "cancelled"
    CANCEL_NOOP = "cancel_noop"  # nothing pending under that id (never was, already delivered or cancelled)
    COMPLETED = "completed"  # a write-back named the pending version: it was delivered (before a rebuild, or by
    # the scheduler being replaced), so it is not delivered again
    COMPLETE_NOOP = "complete_noop"  # the version a write-back names is no longer pending (the usual case)


@dataclass(frozen=True)
class WriteBack:
    """The record a dialect writes back to the request's topic and partition after delivery (value null)."""

    topic: str
    partition: int
    key: Optional[bytes]
    headers: Headers


@dataclass(frozen=True)
class Schedule:
    """One pending version of a schedule: the message and when and where it goes."""

    due_ms: int
    topic: str
    key: Optional[bytes]
    value: Optional[bytes]
    headers: Headers
    delivery_id: str  # stable per version: derived from the request's source offset
    partition: Optional[int] = None  # explicit destination partition
    partition_key: Optional[bytes] = None  # picks the destination partition as Kafka's default partitioner would
    write_back: Optional[WriteBack] = None
    history: bool = False  # copied to the history topic whatever --history says

    def same_message(self, other: "Schedule") -> bool:
        """Strict identity of what would be delivered and when, and of what follows a delivery (the delivery id
        is not part of it). A write-back names its request's offset, so in a write-back dialect an identical
        re-send is a new version: the write-back of the one delivered must name the newest record."""
        return self._identity() == other._identity()

    def _identity(self) -> tuple:
        return (self.due_ms, self.topic, self.key, self.value, self.headers, self.partition, self.partition_key,
                self.write_back, self.history)

    def delivered_headers(self) -> Headers:
        return self.headers + ((DELIVERY_ID, self.delivery_id.encode()),)


@dataclass(frozen=True)
class Request:
    """A valid, decoded request for one schedule id (``schedule`` is None for CANCEL and COMPLETE)."""

    action: Action
    schedule: Optional[Schedule]
    completes: Optional[str] = None  # COMPLETE: the delivery id of the version delivered; None: whatever is pending


class PendingStore(Protocol):
    """Where the pending version of one schedule id lives, with its timer."""

    def get(self) -> Optional[Schedule]: ...

    def replace(self, old: Optional[Schedule], new: Optional[Schedule]) -> None:
        """Swap the stored version ``old`` (and its timer) for ``new`` (and a timer for its due time)."""

    def rearm(self, pending: Schedule) -> None:
        """Make sure a timer for the pending version's due time is set (after a stale timer fired)."""


def apply_request(pending: Optional[Schedule], request: Request) -> tuple[Outcome, Optional[Schedule]]:
    """One request against the pending version of its id: the outcome, and the version pending after it.

    ADD and REPLACE are the same operation on an id: the latest request wins. The
    difference the protocol draws (REPLACE needs an id) is enforced by the decoder.
    """
    if request.action is Action.CANCEL:
        return (Outcome.CANCEL_NOOP, None) if pending is None else (Outcome.CANCELLED, None)
    if request.action is Action.COMPLETE:
        if pending is not None and completes(request, pending.delivery_id):
            return Outcome.COMPLETED, None
        return Outcome.COMPLETE_NOOP, pending
    new = request.schedule
    assert new is not None, "ADD and REPLACE carry a schedule"
    if pending is None:
        return Outcome.SCHEDULED, new
    if pending.same_message(new):
        return Outcome.REPLACE_NOOP, pending
    return Outcome.REPLACED, new


def completes(request: Request, pending_delivery_id: str) -> bool:
    """Whether a COMPLETE request finishes the pending version: the one it names, or (no name) any.
    A write-back never finishes a newer version than the one delivered."""
    return request.completes is None or request.completes == pending_delivery_id


def process_requests(store: PendingStore, requests: Iterable[Request], now_ms: int
                     ) -> tuple[list[Outcome], Optional[Schedule]]:
    """All of one id's requests of a micro-batch, in log order, at rule time ``now_ms`` (the batch
    time plus the lookahead).

    Returns the outcome of each request and the version to deliver now, if the version
    left pending is already due. Within a batch the requests act first and delivery
    comes after them, so a batch holding "ADD due now" then "CANCEL" delivers nothing,
    and two identical requests due now deliver once. The store is written at most once.
    """
    original = store.get()
    pending = original
    outcomes = []
    for request in requests:
        outcome, pending = apply_request(pending, request)
        outcomes.append(outcome)
    due_now = None
    if pending is not None and pending.due_ms <= now_ms:
        due_now, pending = pending, None
    if pending is not original:
        store.replace(original, pending)
    return outcomes, due_now


def fire(store: PendingStore, rule_ms: int) -> Optional[Schedule]:
    """A timer of the id expired: deliver the pending version if it is due by ``rule_ms``.

    The timer is not trusted to name the version: it may be left over from a replaced version,
    or have been set with another lookahead. A pending version not yet due gets its timer again.
    """
    pending = store.get()
    if pending is None:
        return None
    if pending.due_ms > rule_ms:
        store.rearm(pending)
        return None
    store.replace(pending, None)
    return pending


class MemoryStore:
    """A ``PendingStore`` over a dict, with the armed timers kept alongside (tests and tools).

    Timers are (instant, id) pairs set ``lookahead_ms`` before the due time, as in Spark."""

    def __init__(self, pending: dict, timers: set, sid, lookahead_ms: int = 0):
        self._pending, self._timers, self._sid, self._lookahead_ms = pending, timers, sid, lookahead_ms

    def get(self) -> Optional[Schedule]:
        return self._pending.get(self._sid)

    def replace(self, old: Optional[Schedule], new: Optional[Schedule]) -> None:
        if old is not None:
            del self._pending[self._sid]
            self._timers.discard((old.due_ms - self._lookahead_ms, self._sid))
        if new is not None:
            self._pending[self._sid] = new
            self.rearm(new)

    def rearm(self, pending: Schedule) -> None:
        self._timers.add((pending.due_ms - self._lookahead_ms, self._sid))
