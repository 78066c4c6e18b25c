"""The bulk state layout: a timing wheel of time buckets per shard, plus an index of client ids.

One grouping key per *shard* (a hash of the schedule id), so one handler call per shard
per micro-batch sees all of that shard's requests, and state calls are made per bucket,
not per schedule, wherever the rules allow:

  * ``buckets``: due time // BUCKET_MS -> how many chunks, how far it has fired, and the
    delivery ids struck out of it (replaced or cancelled versions: lazy deletion);
  * ``chunks``: (bucket, n) -> a chunk of schedules, written once, as one Arrow blob;
  * ``index``: client schedule id -> where its pending version is (bucket, due time,
    delivery id) and a digest of it, for replace, cancel and the identical-replace no-op.
    Schedules without a client id (ADD without request id) never touch the index.
  * a processing-time timer at the start of each bucket that holds schedules.

An index entry may outlive its schedule (cleaning it at delivery would cost one state
call per schedule on the fire path): it is *stale* once its bucket has fired past its
due time, and a stale entry counts as "nothing pending". Stale entries are removed when
the id is used again. The rules themselves are those of ``schedule.py``: latest request
per id wins, requests of a batch act before the batch's deliveries.

This module is Spark-free: ``ShardStore`` is implemented over dicts here (tests) and over
MapState in ``wheel_processor.py``.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Protocol

import pandas as pd

from .schedule import Action, Outcome, Request, Schedule

BUCKET_MS = 1000
ENTRY_COLUMNS = ["due_ms", "topic", "key", "value", "headers", "delivery_id"]
INTERNAL_SID_PREFIX = "offset:"


def bucket_of(due_ms: int) -> int:
    return due_ms // BUCKET_MS


def bucket_start(bucket: int) -> int:
    return bucket * BUCKET_MS


def digest(schedule: Schedule) -> bytes:
    """What makes two versions "strictly identical": due time, destination, key, value, headers."""
    h = hashlib.blake2b(digest_size=16)

    def part(data: Optional[bytes]) -> None:
        if data is None:
            h.update(b"\xff")
        else:
            h.update(struct.pack(">I", len(data)))
            h.update(data)

    h.update(struct.pack(">q", schedule.due_ms))
    part(schedule.topic.encode())
    part(schedule.key)
    part(schedule.value)
    for name, value in schedule.headers:
        part(name.encode())
        part(value)
    return h.digest()


@dataclass(frozen=True)
class IndexEntry:
    bucket: int
    due_ms: int
    delivery_id: str
    digest: bytes


@dataclass
class BucketInfo:
    chunks: int = 0
    fired_up_to: int = -1  # every schedule of the bucket due at or before this was delivered
    struck: set = field(default_factory=set)  # delivery ids replaced or cancelled while in the bucket


class ShardStore(Protocol):
    """The state of one shard."""

    def index_get(self, sid: str) -> Optional[IndexEntry]: ...
    def index_put(self, sid: str, entry: IndexEntry) -> None: ...
    def index_remove(self, sid: str) -> None: ...
    def bucket_get(self, bucket: int) -> Optional[BucketInfo]: ...
    def bucket_put(self, bucket: int, info: BucketInfo) -> None: ...
    def bucket_remove(self, bucket: int) -> None: ...
    def chunk_get(self, bucket: int, n: int) -> pd.DataFrame: ...
    def chunk_put(self, bucket: int, n: int, entries: pd.DataFrame) -> None: ...
    def chunk_remove(self, bucket: int, n: int) -> None: ...
    def register_timer(self, ms: int) -> None: ...


def entries_frame(schedules: Iterable[Schedule]) -> pd.DataFrame:
    rows = [(s.due_ms, s.topic, s.key, s.value, list(s.headers), s.delivery_id) for s in schedules]
    return pd.DataFrame(rows, columns=ENTRY_COLUMNS)


def schedules_of(frame: pd.DataFrame) -> list[Schedule]:
    return [Schedule(int(r.due_ms), r.topic, r.key, r.value, tuple(tuple(h) for h in r.headers), r.delivery_id)
            for r in frame.itertuples(index=False)]


class _Buckets:
    """Bucket metadata read at most once and written at most once per batch."""

    def __init__(self, store: ShardStore):
        self.store = store
        self.cache: dict[int, Optional[BucketInfo]] = {}
        self.dirty: set[int] = set()

    def get(self, bucket: int) -> Optional[BucketInfo]:
        if bucket not in self.cache:
            self.cache[bucket] = self.store.bucket_get(bucket)
        return self.cache[bucket]

    def holds(self, entry: IndexEntry) -> bool:
        """Whether the version an index entry points at is still pending."""
        info = self.get(entry.bucket)
        return info is not None and entry.due_ms > info.fired_up_to and entry.delivery_id not in info.struck

    def strike(self, entry: IndexEntry) -> None:
        self.get(entry.bucket).struck.add(entry.delivery_id)
        self.dirty.add(entry.bucket)

    def append(self, bucket: int, entries: pd.DataFrame) -> None:
        info = self.get(bucket)
        if info is None:
            info = self.cache[bucket] = BucketInfo()
            self.store.register_timer(bucket_start(bucket))
        elif info.fired_up_to >= 0:
            # Partly fired: its timer waits for the earliest schedule left, maybe later than these.
            self.store.register_timer(int(entries["due_ms"].min()))
        self.store.chunk_put(bucket, info.chunks, entries)
        info.chunks += 1
        self.dirty.add(bucket)

    def flush(self) -> None:
        for bucket in self.dirty:
            self.store.bucket_put(bucket, self.cache[bucket])


def apply_requests(store: ShardStore, requests: Iterable[tuple[str, Request]], now_ms: int,
                   anonymous: Optional[pd.DataFrame] = None) -> tuple[Counter, list[Schedule], pd.DataFrame]:
    """One shard's requests of a micro-batch. Returns outcome counts, the schedules to deliver now
    (due already, after all of the batch's requests acted) and the anonymous ones due now.

    ``requests`` are those with a client id, in log order per id. ``anonymous`` holds the ADDs
    without request id (ENTRY_COLUMNS): nothing can replace or cancel them, so they skip the
    index and are filed in bulk.
    """
    by_sid: dict[str, list[Request]] = {}
    for sid, request in requests:
        by_sid.setdefault(sid, []).append(request)

    buckets = _Buckets(store)
    outcomes: Counter = Counter()
    due_now: list[Schedule] = []
    to_store: dict[int, list[Schedule]] = {}
    for sid, of_sid in by_sid.items():
        internal = sid.startswith(INTERNAL_SID_PREFIX)
        current = None if internal else store.index_get(sid)
        had_entry = current is not None
        if current is not None and not buckets.holds(current):
            current = None  # stale: delivered (or struck) already
        pending: Optional[object] = current  # the IndexEntry while unchanged, else the new Schedule
        pending_digest = current.digest if current is not None else None
        for request in of_sid:
            if request.action is Action.CANCEL:
                outcomes[Outcome.CANCEL_NOOP if pending is None else Outcome.CANCELLED] += 1
                pending, pending_digest = None, None
                continue
            new_digest = digest(request.schedule)
            if pending is None:
                outcomes[Outcome.SCHEDULED] += 1
                pending, pending_digest = request.schedule, new_digest
            elif pending_digest == new_digest:
                outcomes[Outcome.REPLACE_NOOP] += 1
            else:
                outcomes[Outcome.REPLACED] += 1
                pending, pending_digest = request.schedule, new_digest

        if pending is current:
            if current is None and had_entry:
                store.index_remove(sid)  # tidy a stale entry while we are here
            continue
        if current is not None:
            buckets.strike(current)
        if pending is not None and pending.due_ms <= now_ms:
            due_now.append(pending)
            pending = None
        if pending is None:
            if had_entry:
                store.index_remove(sid)
            continue
        bucket = bucket_of(pending.due_ms)
        to_store.setdefault(bucket, []).append(pending)
        if not internal:
            store.index_put(sid, IndexEntry(bucket, pending.due_ms, pending.delivery_id, pending_digest))

    frames = {bucket: entries_frame(schedules) for bucket, schedules in to_store.items()}
    anonymous_due = pd.DataFrame(columns=ENTRY_COLUMNS)
    if anonymous is not None and len(anonymous):
        outcomes[Outcome.SCHEDULED] += len(anonymous)
        due_mask = anonymous["due_ms"] <= now_ms
        anonymous_due = anonymous[due_mask]
        later = anonymous[~due_mask]
        for bucket, group in later.groupby(later["due_ms"] // BUCKET_MS, sort=False):
            frames[int(bucket)] = pd.concat([frames[int(bucket)], group]) if int(bucket) in frames else group
    for bucket, frame in frames.items():
        buckets.append(bucket, frame.reset_index(drop=True))
    buckets.flush()
    return outcomes, due_now, anonymous_due.reset_index(drop=True)


def fire(store: ShardStore, timer_ms: int, now_ms: int) -> pd.DataFrame:
    """A bucket's timer expired: deliver what in it is due (not struck), keep the rest with a new timer."""
    bucket = bucket_of(timer_ms)
    info = store.bucket_get(bucket)
    if info is None:
        return pd.DataFrame(columns=ENTRY_COLUMNS)
    frames = [store.chunk_get(bucket, n) for n in range(info.chunks)]
    for n in range(info.chunks):
        store.chunk_remove(bucket, n)
    entries = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=ENTRY_COLUMNS)
    if info.struck and len(entries):
        entries = entries[~entries["delivery_id"].isin(info.struck)]
    due_mask = entries["due_ms"] <= now_ms
    due, rest = entries[due_mask], entries[~due_mask]
    if len(rest):
        store.chunk_put(bucket, 0, rest.reset_index(drop=True))
        store.bucket_put(bucket, BucketInfo(chunks=1, fired_up_to=now_ms))
        store.register_timer(int(rest["due_ms"].min()))
    else:
        store.bucket_remove(bucket)
    return due.reset_index(drop=True)


class MemoryShardStore:
    """``ShardStore`` over dicts (tests and tools). Timers are kept as a set of (ms, shard)."""

    def __init__(self, shard: int = 0, timers: Optional[set] = None):
        self.shard = shard
        self.index: dict[str, IndexEntry] = {}
        self.buckets: dict[int, BucketInfo] = {}
        self.chunks: dict[tuple[int, int], pd.DataFrame] = {}
        self.timers = timers if timers is not None else set()

    def index_get(self, sid):
        return self.index.get(sid)

    def index_put(self, sid, entry):
        self.index[sid] = entry

    def index_remove(self, sid):
        self.index.pop(sid, None)

    def bucket_get(self, bucket):
        info = self.buckets.get(bucket)
        # A copy, as a state store would hand back: changes count only once written.
        return None if info is None else BucketInfo(info.chunks, info.fired_up_to, set(info.struck))

    def bucket_put(self, bucket, info):
        self.buckets[bucket] = BucketInfo(info.chunks, info.fired_up_to, set(info.struck))

    def bucket_remove(self, bucket):
        self.buckets.pop(bucket, None)

    def chunk_get(self, bucket, n):
        return self.chunks[(bucket, n)].copy()

    def chunk_put(self, bucket, n, entries):
        self.chunks[(bucket, n)] = entries.copy()

    def chunk_remove(self, bucket, n):
        self.chunks.pop((bucket, n), None)

    def register_timer(self, ms):
        self.timers.add((ms, self.shard))
