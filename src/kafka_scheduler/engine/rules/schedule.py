"""The request model, free of Spark: schedules, requests, actions and outcomes, and the COMPLETE rule.

The rules that fold a batch's requests per id and decide what is due live in ``batch.py`` and the modules beside it
(the state layout behind the ``ShardStore`` interface of ``store.py``), tested against a reference model in
milliseconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# A firing's delivery id, as the rules read it from here (delivery_ids.py holds the grammar).
from ...protocol import CLIENT_SID_PREFIX, CRON_SID_PREFIX, INTERNAL_SID_PREFIX

Headers = tuple[tuple[str, bytes | None], ...]


def is_internal(sid: bytes) -> bool:
    return sid[: len(INTERNAL_SID_PREFIX)] == INTERNAL_SID_PREFIX


def is_cron(sid: bytes) -> bool:
    return sid[: len(CRON_SID_PREFIX)] == CRON_SID_PREFIX


def input_topic_of(sid) -> str:
    """The input topic a schedule id is scoped by ("" for an id of another form): outcomes are counted per topic."""
    sid = bytes(sid)
    for prefix in (CLIENT_SID_PREFIX, CRON_SID_PREFIX, INTERNAL_SID_PREFIX):
        if sid[: len(prefix)] == prefix:
            topic, sep, _ = sid[len(prefix) :].partition(b"/")
            return topic.decode(errors="replace") if sep else ""
    return ""


class Action(StrEnum):
    ADD = "ADD"
    REPLACE = "REPLACE"
    CANCEL = "CANCEL"
    COMPLETE = "COMPLETE"  # a write-back read back: the version it names was delivered
    # Recurring schedules (Kaspr's actions), in the id space of crons (protocol.CRON_SID_PREFIX)
    CRON_ADD = "CRON_ADD"  # register, or replace the cron of that id
    CRON_PAUSE = "CRON_PAUSE"
    CRON_RESUME = "CRON_RESUME"
    CRON_CANCEL = "CRON_CANCEL"


class Outcome(StrEnum):
    """Exactly one per valid request (rejections are counted by the decoder)."""

    SCHEDULED = "scheduled"  # nothing was pending under the id: stored (or delivered at once if due)
    REPLACED = "replaced"  # a pending version was swapped for this one
    REPLACE_NOOP = "replace_noop"  # identical to the pending version: nothing changes
    CANCELLED = "cancelled"
    CANCEL_NOOP = "cancel_noop"  # nothing pending under that id (never was, already delivered or cancelled)
    COMPLETED = "completed"  # a write-back named the pending version: it was delivered (before a rebuild, or by
    # the scheduler being replaced), so it is not delivered again
    COMPLETE_NOOP = "complete_noop"  # the version a write-back names is no longer pending (the usual case)
    CRON_ADDED = "cron_added"  # no cron had the id: it is registered (and has its first firing, unless past its end)
    CRON_REPLACED = "cron_replaced"  # a cron (active or paused) had the id: this definition replaces it, active
    CRON_REPLACE_NOOP = "cron_replace_noop"  # identical to the active cron of the id: nothing changes
    CRON_PAUSED = "cron_paused"
    CRON_PAUSE_NOOP = "cron_pause_noop"  # no cron with the id, or paused already
    CRON_RESUMED = "cron_resumed"
    CRON_RESUME_NOOP = "cron_resume_noop"  # no cron with the id, or not paused
    CRON_CANCELLED = "cron_cancelled"
    CRON_CANCEL_NOOP = "cron_cancel_noop"  # no cron with the id
    REJECTED = "rejected"  # a CRON_ADD whose expression or zone the rules refuse (the decoder rejects the rest)


@dataclass(frozen=True)
class WriteBack:
    """The record a dialect writes back to the request's topic and partition after delivery (value null)."""

    topic: str
    partition: int
    key: bytes | None
    headers: Headers


@dataclass(frozen=True)
class Cron:
    """What makes a schedule recurring: its expression (croniter's syntax), zone (IANA; None: UTC), what happens to
    firings missed while the job was down or the cron paused (``replay`` or ``skip``), and its bounds."""

    expr: str
    tz: str | None = None
    policy: str = "replay"
    start_ms: int | None = None  # no firing before
    end_ms: int | None = None  # no firing after; past it the cron leaves state


@dataclass(frozen=True)
class Schedule:
    """One pending version of a schedule: the message and when and where it goes."""

    due_ms: int
    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers
    delivery_id: str  # stable per version: derived from the request's source offset
    partition: int | None = None  # explicit destination partition
    partition_key: bytes | None = None  # picks the destination partition as Kafka's default partitioner would
    write_back: WriteBack | None = None
    history: bool = False  # copied to the history topic whatever --history says
    max_lateness_ms: int | None = None  # written later than due + this: rejected as expired instead
    cron: Cron | None = None  # a cron's firing (due_ms, delivery_id: firing_id(...)), or a CRON_ADD's definition


@dataclass(frozen=True)
class Request:
    """A valid, decoded request for one schedule id (``schedule`` is None for CANCEL and COMPLETE)."""

    action: Action
    schedule: Schedule | None
    completes: str | None = None  # COMPLETE: the delivery id of the version delivered; None: whatever is pending
    # CRON_ADD: the request's headers as read (all of them), for its rejection should the rules refuse it
    raw_headers: Headers | None = None
    # CRON_ADD, CRON_RESUME: the request's delivery id (source topic-partition-offset): the cron's activation,
    # which its firing ids start with
    activation: str | None = None


def completes(request: Request, pending_delivery_id: str) -> bool:
    """Whether a COMPLETE request finishes the pending version: the one it names, or (no name) any.
    A write-back never finishes a newer version than the one delivered."""
    return request.completes is None or request.completes == pending_delivery_id
