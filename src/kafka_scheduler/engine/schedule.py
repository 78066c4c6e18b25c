"""The request model, free of Spark: schedules, requests, actions and outcomes, and the COMPLETE rule.

The rules that fold a batch's requests per id and decide what is due live in ``wheel.py`` (the state
layout, behind its ``ShardStore`` interface), tested against a reference model in milliseconds.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional


Headers = tuple[tuple[str, Optional[bytes]], ...]

from ..protocol import CLIENT_SID_PREFIX, INTERNAL_SID_PREFIX


def is_internal(sid: bytes) -> bool:
    return sid[:len(INTERNAL_SID_PREFIX)] == INTERNAL_SID_PREFIX


def input_topic_of(sid) -> str:
    """The input topic a schedule id is scoped by ("" for an id of another form): outcomes are counted per topic."""
    sid = bytes(sid)
    for prefix in (CLIENT_SID_PREFIX, INTERNAL_SID_PREFIX):
        if sid[:len(prefix)] == prefix:
            topic, sep, _ = sid[len(prefix):].partition(b"/")
            return topic.decode(errors="replace") if sep else ""
    return ""



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



@dataclass(frozen=True)
class Request:
    """A valid, decoded request for one schedule id (``schedule`` is None for CANCEL and COMPLETE)."""

    action: Action
    schedule: Optional[Schedule]
    completes: Optional[str] = None  # COMPLETE: the delivery id of the version delivered; None: whatever is pending


def completes(request: Request, pending_delivery_id: str) -> bool:
    """Whether a COMPLETE request finishes the pending version: the one it names, or (no name) any.
    A write-back never finishes a newer version than the one delivered."""
    return request.completes is None or request.completes == pending_delivery_id
