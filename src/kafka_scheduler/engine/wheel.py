"""The bulk state layout: a timing wheel of time buckets per shard, plus an index of client ids.

One grouping key per *shard* (a hash of the schedule id), so one handler call per shard
per micro-batch sees all of that shard's requests, and state calls are made per bucket,
not per schedule, wherever the rules allow:

  * ``buckets``: due time // BUCKET_MS -> a ``BucketInfo``: which chunks and strike lists
    it holds, its live timer, and the record of its partial fires;
  * ``chunks``: (bucket, n) -> a chunk of schedules, written once, as one Arrow blob of at
    most about ``SEAL_BYTES`` (small chunks are merged, so a bucket filled by many batches
    keeps a few dozen chunks, not one per batch);
  * ``strikes``: (bucket, n) -> delivery ids struck out of the bucket by a replace or
    cancel (lazy deletion: chunks are not rewritten), one list per batch, merged the same
    way, so a strike costs in proportion to the batch's strikes, not the bucket's;
  * the id index: client schedule id -> where its pending version is (due time, hence bucket;
    delivery id) and a digest of it, for replace, cancel and the identical-replace no-op. It is
    held in the worker's memory and kept in state as a versioned delta log (``index_cache.py``);
    each chunk row carries its ``sid`` and ``digest`` so the index can be rebuilt from the chunks.
    ADDs without request id never touch it (their rows carry no sid);
  * ``armed``: timer instant -> the buckets armed at it, so a timer names its buckets
    whatever ``--lookahead`` was when it was set;
  * ``seq``: a per-shard counter, advanced by every handler call that changes the shard.

The index is exact: an entry exists exactly while its version is pending. A request that
replaces, cancels or completes a version rewrites or removes the entry; a fire removes the
entries of what it delivers (``_Shard.forget``), in bulk: no state call per schedule.

This module is Spark-free: ``ShardStore`` is implemented over dicts here (tests) and over
Spark state in ``wheel_processor.py``.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Protocol

import numpy as np
import pandas as pd

from ..protocol import ENTRY_OVERHEAD_BYTES
from .index_cache import IndexCache, IndexEntry, IndexSession, IndexToken
from .schedule import Action, Outcome, Request, Schedule, WriteBack, completes, input_topic_of, is_internal

BUCKET_MS = 1000
# How fast a shard's fire reads, filters and emits a bucket's chunks, conservatively: a bucket is prepared this much
# earlier per byte it holds. Measured with the 10M herd with ids on 2 cores: 4 shards of ~250 MB of chunks each,
# emitted in 86 s by one batch (about 3 MB/s per shard: the shards share the cores); a 1M herd's batch read its
# 4 x 25 MB in 10.1 s (2.5 MB/s per shard) in a later run.
PREPARE_BYTES_PER_S = 2_000_000
FAR_FUTURE_MS = 2**62
# A chunk (or strike list) at least half this big is final: never merged again. Bounds every
# state value the layout writes (one schedule bigger than this is a chunk of its own).
SEAL_BYTES = 4 * 1024 * 1024
SEAL_STRIKES = 65_536
ENTRY_COLUMNS = ["due_ms", "topic", "key", "value", "headers", "delivery_id", "entry_bytes",
                 # what some dialects add (null for native requests): see schedule.Schedule
                 "partition", "partition_key", "wb_topic", "wb_partition", "wb_key", "wb_headers", "history",
                 # the client id and digest of the version (null without request id): rebuild the index
                 "sid", "digest"]
INDEX_COLUMNS = ["sid", "digest"]


def bucket_of(due_ms: int) -> int:
    return due_ms // BUCKET_MS


def _part(pieces: list, data: Optional[bytes]) -> None:
    """One field of a digest: its length and bytes, or 0xff for null (so no two field lists encode alike)."""
    if data is None:
        pieces.append(b"\xff")
    else:
        pieces.append(struct.pack(">I", len(data)))
        pieces.append(data)


def _header_parts(pieces: list, pairs) -> None:
    pieces.append(struct.pack(">I", len(pairs)))
    for name, value in pairs:
        _part(pieces, name.encode())
        _part(pieces, value)


def _native_digest(due_ms: int, topic: str, key: Optional[bytes], value: Optional[bytes], header_list):
    """The digest of the fields every version has (a blake2b object, to go on with the rest)."""
    pieces = [struct.pack(">q", due_ms)]
    _part(pieces, topic.encode())
    _part(pieces, key)
    _part(pieces, value)
    _header_parts(pieces, header_list)
    h = hashlib.blake2b(digest_size=16)
    h.update(b"".join(pieces))
    return h


def aligned_lead_ms(lead_ms: int) -> int:
    """A lead of a second or more, rounded up to a power of two seconds. The shards of a herd hold about the same
    bytes; with leads a few ms apart their buckets would fire in different batches, and the first batch, writing
    its shard's part of the herd at the instant (beyond ``--max-held``), would hold the job until then: the other
    shards would only start preparing theirs at the instant (a 10M herd: a quarter on time, the rest 80 s late)."""
    if lead_ms < 1000:
        return lead_ms
    return 1000 << (-(-lead_ms // 1000) - 1).bit_length()


def digest_of_entry(r) -> bytes:
    """``digest(schedule_of_entry(r))``, without making the Schedule for a native row (the ingest path)."""
    if missing(r.partition) and missing(r.partition_key) and missing(r.wb_headers) and not flag(r.history):
        return _native_digest(int(r.due_ms), r.topic, optional_bytes(r.key), optional_bytes(r.value),
                              [(name, optional_bytes(value)) for name, value in header_pairs(r.headers)]).digest()
    return digest(schedule_of_entry(r))


def digest(schedule: Schedule) -> bytes:
    """What makes two versions "strictly identical": due time, destination, key, value, headers. Stored in
    checkpoints (chunk rows, the index): the encoding must never change."""
    h = _native_digest(schedule.due_ms, schedule.topic, schedule.key, schedule.value, schedule.headers)
    if schedule.partition is not None or schedule.partition_key is not None or schedule.write_back is not None \
            or schedule.history:
        # Only dialects other than native get here, so digests of native schedules stay as they were.
        pieces = [b"+"]
        _part(pieces, None if schedule.partition is None else str(schedule.partition).encode())
        _part(pieces, schedule.partition_key)
        back = schedule.write_back
        if back is None:
            pieces.append(b"\xff")
        else:
            _part(pieces, back.topic.encode())
            pieces.append(struct.pack(">i", back.partition))
            _part(pieces, back.key)
            _header_parts(pieces, back.headers)
        pieces.append(b"h" if schedule.history else b"-")
        h.update(b"".join(pieces))
    return h.digest()


def entry_bytes(schedule: Schedule) -> int:
    """Rough stored size, to bound chunks (the decoder computes the same in Spark SQL)."""
    def header_bytes(pairs) -> int:
        return sum(len(name.encode()) + len(value or b"") for name, value in pairs)

    back = schedule.write_back
    return (ENTRY_OVERHEAD_BYTES + len(schedule.key or b"") + len(schedule.value or b"")
            + header_bytes(schedule.headers)
            + (0 if back is None else len(back.key or b"") + header_bytes(back.headers)))


@dataclass
class BucketInfo:
    created_seq: int
    timer_ms: int  # the one live timer of the bucket (any other timer naming it is stale)
    next_n: int = 0  # numbers chunks and strike lists; never reused within the bucket
    chunks: list = field(default_factory=list)  # [(n, bytes)] of the live schedule chunks
    strikes: list = field(default_factory=list)  # [(n, count)] of the strike lists
    fires: list = field(default_factory=list)  # [(seq, rule time)] of partial fires (no longer read)
    # The prepare mark: in run ``prep_run``, every schedule of the bucket due by ``prep_through`` was emitted
    # (prepared for the timed writer, or written). Another run's mark means nothing: its writer is gone.
    prep_run: str = ""
    prep_through: int = -1

    def copy(self) -> "BucketInfo":
        return BucketInfo(self.created_seq, self.timer_ms, self.next_n, list(self.chunks), list(self.strikes),
                          list(self.fires), self.prep_run, self.prep_through)

    def prepared_through(self, run: str) -> Optional[int]:
        return self.prep_through if run and self.prep_run == run else None


def record_fire(fires: list, seq: int, rule_ms: int) -> list:
    """Add a fire, keeping only those no later fire with a later rule time makes redundant."""
    return [(s, t) for s, t in fires if t > rule_ms] + [(seq, rule_ms)]


class ShardStore(Protocol):
    """The state of one shard."""

    cache: IndexCache  # the worker's copy of this shard's index

    def next_seq(self) -> int: ...
    def index_token_get(self) -> Optional[IndexToken]: ...
    def index_token_put(self, token: IndexToken) -> None: ...
    def delta_get(self, version: int, part: int) -> list: ...
    def delta_put(self, version: int, part: int, changes: list) -> None: ...
    def delta_remove(self, version: int, part: int) -> None: ...
    def bucket_items(self) -> Iterator[tuple[int, BucketInfo]]: ...
    def chunk_index(self, bucket: int, n: int) -> pd.DataFrame:
        """Columns sid, due_ms, delivery_id, digest of a chunk (what a rebuild of the index reads)."""
    def bucket_get(self, bucket: int) -> Optional[BucketInfo]: ...
    def bucket_put(self, bucket: int, info: BucketInfo) -> None: ...
    def bucket_remove(self, bucket: int) -> None: ...
    def chunk_get(self, bucket: int, n: int) -> pd.DataFrame: ...
    def chunk_put(self, bucket: int, n: int, entries: pd.DataFrame) -> None: ...
    def chunk_remove(self, bucket: int, n: int) -> None: ...
    def strikes_get(self, bucket: int, n: int) -> list: ...
    def strikes_put(self, bucket: int, n: int, delivery_ids: list) -> None: ...
    def strikes_remove(self, bucket: int, n: int) -> None: ...
    def armed_get(self, timer_ms: int) -> list: ...
    def armed_put(self, timer_ms: int, buckets: list) -> None: ...
    def armed_remove(self, timer_ms: int) -> None: ...
    def register_timer(self, timer_ms: int) -> None: ...


def entries_frame(schedules: Iterable[Schedule], ids: Optional[Iterable[tuple]] = None) -> pd.DataFrame:
    """``ids``: (sid, digest) of each schedule; None: schedules without request id."""
    rows = []
    for s, (sid, version_digest) in zip(schedules, ids if ids is not None else itertools.repeat((None, None))):
        back = s.write_back
        rows.append((s.due_ms, s.topic, s.key, s.value, list(s.headers), s.delivery_id, entry_bytes(s),
                     s.partition, s.partition_key,
                     *((None, None, None, None) if back is None else
                       (back.topic, back.partition, back.key, list(back.headers))),
                     s.history, sid, version_digest))
    return pd.DataFrame(rows, columns=ENTRY_COLUMNS).astype({"partition": object, "wb_partition": object})


def missing(value) -> bool:
    """A null cell of a frame: pandas holds a missing one as None, or NaN in a numeric column."""
    return value is None or (isinstance(value, float) and pd.isna(value))


def optional_int(value) -> Optional[int]:
    """An int cell of a frame: pandas may hold a missing one as None, NaN or pd.NA."""
    return None if value is None or pd.isna(value) else int(value)


def optional_bytes(value) -> Optional[bytes]:
    return None if missing(value) else bytes(value)


def flag(value) -> bool:
    return not missing(value) and bool(value)


def header_pairs(cell) -> list:
    """(name, value) pairs of a headers cell: tuples, or the dicts and Rows Spark and Arrow hand over."""
    if missing(cell):
        return []
    return [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in cell]


def headers_of(cell) -> tuple:
    return tuple((name, optional_bytes(value)) for name, value in header_pairs(cell))


def schedule_of_entry(r) -> Schedule:
    """A Schedule from a row (itertuples) of an entries frame or of the processor's request frame."""
    wb_headers = getattr(r, "wb_headers", None)
    return Schedule(int(r.due_ms), r.topic, optional_bytes(r.key), optional_bytes(r.value), headers_of(r.headers),
                    r.delivery_id,
                    partition=optional_int(getattr(r, "partition", None)),
                    partition_key=optional_bytes(getattr(r, "partition_key", None)),
                    write_back=None if missing(wb_headers) else WriteBack(
                        r.wb_topic, int(r.wb_partition), optional_bytes(r.wb_key), headers_of(wb_headers)),
                    history=flag(getattr(r, "history", False)))


def schedules_of(frame: pd.DataFrame) -> list[Schedule]:
    return [schedule_of_entry(r) for r in frame.itertuples(index=False)]


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=ENTRY_COLUMNS)


def split_by_bytes(frame: pd.DataFrame, limit: Optional[int] = None) -> list[pd.DataFrame]:
    """Consecutive slices of about ``limit`` bytes: a row goes to the slice in which it starts, so a
    slice exceeds ``limit`` by at most its last row."""
    if not len(frame):
        return []
    limit = limit or SEAL_BYTES
    sizes = frame["entry_bytes"].to_numpy(dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    slice_of = starts // limit
    cuts = [0, *(np.flatnonzero(np.diff(slice_of)) + 1).tolist(), len(sizes)]
    if len(cuts) == 2:
        return [frame.reset_index(drop=True)]
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts, cuts[1:])]


def merge_small(parts: list, seal: int, merge: Callable[[tuple, tuple], tuple]) -> list:
    """Keep the unsealed parts (weight below seal/2) of a list geometric: while the newest two
    are within a factor of two of each other, merge them. Each item is then rewritten
    O(log) times before it is sealed, and at most O(log seal) parts stay unsealed."""
    while True:
        small = [p for p in parts if p[1] < seal // 2]
        if len(small) < 2 or small[-2][1] > 2 * small[-1][1]:
            return parts
        older, newer = small[-2], small[-1]
        merged = merge(older, newer)
        parts = [p for p in parts if p is not older and p is not newer] + [merged]


def step(pending, pending_digest: Optional[bytes], request: Request):
    """One request against the id's pending version (an IndexEntry while unchanged, else a Schedule):
    its outcome, and the pending version and digest after it. Latest request wins."""
    if request.action is Action.CANCEL:
        return (Outcome.CANCEL_NOOP if pending is None else Outcome.CANCELLED), None, None
    if request.action is Action.COMPLETE:
        if pending is not None and completes(request, pending.delivery_id):
            return Outcome.COMPLETED, None, None
        return Outcome.COMPLETE_NOOP, pending, pending_digest
    new_digest = digest(request.schedule)
    if pending is None:
        return Outcome.SCHEDULED, request.schedule, new_digest
    if pending_digest == new_digest:
        return Outcome.REPLACE_NOOP, pending, pending_digest
    return Outcome.REPLACED, request.schedule, new_digest


class _Shard:
    """One handler call's view of the shard: bucket metadata and armed timers read at most once,
    written at most once; chunks and strike lists written as they are made."""

    def __init__(self, store: ShardStore, seq: int, now_ms: int, window_ms: int, run: str, lazy: bool = False):
        self.store, self.seq, self.now_ms, self.window_ms, self.run = store, seq, now_ms, window_ms, run
        self.cache: dict[int, Optional[BucketInfo]] = {}
        self.dirty: set[int] = set()
        self.armed: dict[int, list] = {}
        self.struck: dict[int, list] = {}
        # Synced before the call changes anything: a rebuild reads the chunks as the last call left them.
        # One state read when the cache is current. A fire's is lazy: it only forgets (IndexSession.forget).
        self._index = IndexSession(store, lazy=lazy)

    def index(self) -> IndexSession:
        return self._index

    def forget(self, delivered: pd.DataFrame) -> None:
        """Schedules leave state: their ids leave the index (recorded in this call's delta, in bulk). Call it
        wherever entries leave state for good (delivered, or prepared and retired): an id re-filed since keeps
        its newer entry. Written with the rest at ``flush``."""
        sids = delivered["sid"]
        with_id = sids.notna().to_numpy()
        if with_id.any():
            self.index().forget(sids[with_id], delivered["delivery_id"][with_id])

    def get(self, bucket: int) -> Optional[BucketInfo]:
        if bucket not in self.cache:
            self.cache[bucket] = self.store.bucket_get(bucket)
        return self.cache[bucket]

    def written(self, entry: IndexEntry) -> bool:
        """Prepared in this run and due by now: the timed writer has written it (the sink makes sure before the
        batch commits), though the bucket, and so the index, still hold it until a fire retires it."""
        info = self.get(bucket_of(entry.due_ms))
        through = None if info is None else info.prepared_through(self.run)
        return through is not None and entry.due_ms <= through and entry.due_ms <= self.now_ms

    def may_be_held(self, entry: IndexEntry) -> bool:
        """Whether the timed writer may hold this pending version (prepared in this run, not yet due)."""
        info = self.get(bucket_of(entry.due_ms))
        through = None if info is None else info.prepared_through(self.run)
        return through is not None and entry.due_ms <= through

    def strike(self, entry: IndexEntry) -> None:
        self.struck.setdefault(bucket_of(entry.due_ms), []).append(entry.delivery_id)

    def arm(self, bucket: int, info: BucketInfo, timer_ms: int) -> None:
        info.timer_ms = timer_ms
        if timer_ms not in self.armed:
            self.armed[timer_ms] = list(self.store.armed_get(timer_ms))
            self.store.register_timer(timer_ms)
        self.armed[timer_ms].append(bucket)

    def lead_ms(self, info: BucketInfo) -> int:
        """How much earlier than the window a bucket is prepared: in proportion to what it holds, so that a
        herd of millions due at one instant is read and emitted before that instant (zero without a window)."""
        if not self.window_ms:
            return 0
        return aligned_lead_ms(sum(size for _, size in info.chunks) * 1000 // PREPARE_BYTES_PER_S)

    def file(self, bucket: int, entries: pd.DataFrame) -> bool:
        """Add schedules (none of them due yet) to a bucket, creating or re-arming it as needed. Returns
        whether the bucket is to be prepared now (then the caller ripens it, which arms it)."""
        info = self.get(bucket)
        if info is None:
            info = self.cache[bucket] = BucketInfo(created_seq=self.seq, timer_ms=FAR_FUTURE_MS)
        self.write_chunks(bucket, info, entries)
        timer_ms = int(entries["due_ms"].min()) - self.window_ms - self.lead_ms(info)
        if timer_ms <= self.now_ms:
            return True
        if timer_ms < info.timer_ms:
            self.arm(bucket, info, timer_ms)
        return False

    def ripen(self, bucket: int, info: BucketInfo) -> Iterator[pd.DataFrame]:
        """The bucket at batch time ``now``: emit what is due by now + window (+ the bucket's lead) and was not
        emitted in this run yet (one frame per chunk, so a huge bucket flows out in bounded pieces), drop what
        is due by now (written, or going out in this batch; its ids leave the index), keep the rest, and arm
        the bucket again: at its earliest prepared due time (to retire it), or its earliest unprepared one
        minus the window and lead."""
        now, prep_ms = self.now_ms, self.now_ms + self.window_ms + self.lead_ms(info)
        struck: set = set(self.struck.pop(bucket, ()))
        for n, _ in info.strikes:
            struck.update(self.store.strikes_get(bucket, n))
            self.store.strikes_remove(bucket, n)
        info.strikes = []
        through = info.prepared_through(self.run)
        through_after = prep_ms if through is None else max(prep_ms, through)
        kept_chunks, new_chunks, rest, leaving = [], [], [], []
        bucket_bytes = sum(size for _, size in info.chunks)
        rest_bytes = 0
        retire_at: Optional[int] = None  # the earliest due time of what stays prepared
        prepare_at: Optional[int] = None  # the earliest due time of what stays unprepared
        for n, size in info.chunks:
            frame = self.store.chunk_get(bucket, n)
            changed = False
            if struck:
                unstruck = ~frame["delivery_id"].isin(struck)
                if not unstruck.all():
                    frame, changed = frame[unstruck], True
            due = frame["due_ms"]
            emit = due <= prep_ms
            if through is not None:
                emit &= due > through
            if emit.any():
                yield frame[emit].reset_index(drop=True)
            gone = due <= now
            if gone.any():
                leaving.append(frame.loc[gone, ["sid", "delivery_id"]])
            later_due = due[~gone]
            if len(later_due):
                prepared = later_due <= through_after
                if prepared.any():
                    low = int(later_due[prepared].min())
                    retire_at = low if retire_at is None else min(retire_at, low)
                if not prepared.all():
                    low = int(later_due[~prepared].min())
                    prepare_at = low if prepare_at is None else min(prepare_at, low)
            if not changed and not gone.any():
                kept_chunks.append((n, size))  # untouched: no rewrite
                continue
            self.store.chunk_remove(bucket, n)
            later = frame[~gone]
            if len(later):
                rest.append(later)
                rest_bytes += int(later["entry_bytes"].sum())
                if rest_bytes >= SEAL_BYTES:
                    new_chunks += self._put_chunks(bucket, info, pd.concat(rest, ignore_index=True))
                    rest, rest_bytes = [], 0
        if rest:
            new_chunks += self._put_chunks(bucket, info, pd.concat(rest, ignore_index=True))
        info.chunks = kept_chunks + new_chunks
        if new_chunks:
            info.chunks = merge_small(info.chunks, SEAL_BYTES, lambda a, b: self._merge_chunks(bucket, info, a, b))
        if retire_at is None and prepare_at is None:
            if leaving and self._forget_by_due_time(bucket_bytes):
                self.index().forget_due(bucket * BUCKET_MS, (bucket + 1) * BUCKET_MS - 1,
                                        sum(int(frame["sid"].notna().sum()) for frame in leaving))
            elif leaving:
                self.forget(pd.concat(leaving, ignore_index=True))
            self.cache[bucket] = None
            self.dirty.discard(bucket)
            self.store.bucket_remove(bucket)
            return
        if leaving:
            self.forget(pd.concat(leaving, ignore_index=True))
        info.fires = record_fire(info.fires, self.seq, now)
        info.prep_run, info.prep_through = self.run, through_after
        lead = self.lead_ms(info)
        self.arm(bucket, info, min(t for t in (retire_at, None if prepare_at is None else
                                               max(now + 1, prepare_at - self.window_ms - lead)) if t is not None))
        self.dirty.add(bucket)

    def _forget_by_due_time(self, bucket_bytes: int) -> bool:
        """Whether the ids of a bucket leaving state whole leave the index as one change, by due time (a scan
        of the index in memory, ~60 ns an entry), rather than id by id (a change each, ~1 µs, written to the
        delta log): when the bucket holds more entries than a tenth of the index (a herd)."""
        index = self.index()
        return not index.synced or bucket_bytes // ENTRY_OVERHEAD_BYTES * 10 >= len(index)

    def write_chunks(self, bucket: int, info: BucketInfo, entries: pd.DataFrame) -> None:
        info.chunks.extend(self._put_chunks(bucket, info, entries))
        info.chunks = merge_small(info.chunks, SEAL_BYTES, lambda a, b: self._merge_chunks(bucket, info, a, b))
        self.dirty.add(bucket)

    def _put_chunks(self, bucket: int, info: BucketInfo, entries: pd.DataFrame) -> list:
        return [self._put_chunk(bucket, info, piece) for piece in split_by_bytes(entries)]

    def _put_chunk(self, bucket: int, info: BucketInfo, piece: pd.DataFrame) -> tuple:
        n, info.next_n = info.next_n, info.next_n + 1
        self.store.chunk_put(bucket, n, piece)
        return n, int(piece["entry_bytes"].sum())

    def _merge_chunks(self, bucket: int, info: BucketInfo, older: tuple, newer: tuple) -> tuple:
        frames = [self.store.chunk_get(bucket, older[0]), self.store.chunk_get(bucket, newer[0])]
        self.store.chunk_remove(bucket, older[0])
        self.store.chunk_remove(bucket, newer[0])
        return self._put_chunk(bucket, info, pd.concat(frames, ignore_index=True))

    def _put_strikes(self, bucket: int, info: BucketInfo, ids: list) -> tuple:
        n, info.next_n = info.next_n, info.next_n + 1
        self.store.strikes_put(bucket, n, ids)
        return n, len(ids)

    def _merge_strikes(self, bucket: int, info: BucketInfo, older: tuple, newer: tuple) -> tuple:
        ids = list(self.store.strikes_get(bucket, older[0])) + list(self.store.strikes_get(bucket, newer[0]))
        self.store.strikes_remove(bucket, older[0])
        self.store.strikes_remove(bucket, newer[0])
        return self._put_strikes(bucket, info, ids)

    def flush(self) -> None:
        for bucket, ids in self.struck.items():
            info = self.get(bucket)
            if info is None:
                continue  # ripened away in this call
            info.strikes.append(self._put_strikes(bucket, info, ids))
            info.strikes = merge_small(info.strikes, SEAL_STRIKES,
                                       lambda a, b, bucket=bucket, info=info: self._merge_strikes(bucket, info, a, b))
            self.dirty.add(bucket)
        for bucket in self.dirty:
            if self.cache[bucket] is not None:
                self.store.bucket_put(bucket, self.cache[bucket])
        for timer_ms, buckets in self.armed.items():
            self.store.armed_put(timer_ms, buckets)
        self._index.commit()


@dataclass
class BatchResult:
    """What one handler call hands to the sink."""
    outcomes: Counter = field(default_factory=Counter)
    # The same outcomes per input topic, (Outcome, topic) -> n, and the schedules delivered at once (due when
    # read) per input topic: for the metrics (ops/metrics.py).
    by_topic: Counter = field(default_factory=Counter)
    at_once: Counter = field(default_factory=Counter)
    emitted: list = field(default_factory=list)  # entries frames: due by now (write now) or later (prepared)
    withdrawn: list = field(default_factory=list)  # delivery ids the timed writer may hold and must drop

    def schedules(self) -> list[Schedule]:
        return [s for frame in self.emitted for s in schedules_of(frame)]


def apply_requests(store: ShardStore, requests: Iterable[tuple[bytes, Request]], now_ms: int,
                   anonymous: Optional[pd.DataFrame] = None, window_ms: int = 0, run: str = "",
                   keyed: Optional[pd.DataFrame] = None) -> BatchResult:
    """One shard's requests of a micro-batch at batch time ``now_ms``.

    Emits the schedules due by ``now_ms`` once all of the batch's requests acted (they leave state), and
    prepares those due by ``now_ms + window_ms``: emitted for the timed writer of run ``run`` but kept in
    state until a fire after their due time retires them, so a crash before the writer wrote them loses
    nothing. A replace or cancel of a version the writer may hold withdraws it.

    ``requests`` are those with a client id, in log order per id. ``anonymous`` holds the ADDs
    without request id (ENTRY_COLUMNS): nothing can replace or cancel them, so they skip the
    index and are filed in bulk (an optional ``src_topic`` column names their input topic for the counts
    per topic; their ids are not kept). ``keyed`` (ENTRY_COLUMNS, digest not needed) holds ADDs and
    REPLACEs with a client id that no other request of the batch names: those whose id has no
    pending version (the usual case) are filed in bulk too, without a Schedule per row (``src_topic``, optional,
    as for ``anonymous``).
    """
    by_sid: dict[bytes, list[Request]] = {}
    for sid, request in requests:
        by_sid.setdefault(sid, []).append(request)
    has_anonymous = anonymous is not None and len(anonymous) > 0
    has_keyed = keyed is not None and len(keyed) > 0
    result = BatchResult()
    if not by_sid and not has_anonymous and not has_keyed:
        return result

    shard = _Shard(store, store.next_seq(), now_ms, window_ms, run)
    outcomes, by_topic = result.outcomes, result.by_topic
    due_now: list[Schedule] = []
    to_file: dict[int, tuple[list[Schedule], list[tuple]]] = {}
    index = shard.index()
    fresh = None
    if has_keyed:
        entries = index.entries()
        known = np.fromiter((bytes(sid) in entries for sid in keyed["sid"]), dtype=bool, count=len(keyed))
        for r in keyed[known].itertuples(index=False):  # a version is pending: the rules, one by one
            by_sid[bytes(r.sid)] = [Request(Action(r.action), schedule_of_entry(r))]
        fresh = keyed[~known]
    for sid, of_sid in by_sid.items():
        internal = is_internal(sid)
        topic = input_topic_of(sid)
        current = None if internal else index.get(sid)
        written = None
        if current is not None and shard.written(current):
            # Written at its due time: gone for the rules. Its entry stays until a fire retires it, unless a
            # new version takes the id first (then it is struck, so that a rebuild from the chunks agrees).
            written, current = current, None
        pending, pending_digest = current, (current.digest if current is not None else None)
        for request in of_sid:
            outcome, pending, pending_digest = step(pending, pending_digest, request)
            outcomes[outcome] += 1
            by_topic[(outcome, topic)] += 1

        if pending is current:
            continue
        if current is not None:
            shard.strike(current)
            if shard.may_be_held(current):
                result.withdrawn.append(current.delivery_id)
        if written is not None:
            shard.strike(written)
        if pending is not None and pending.due_ms <= now_ms:
            due_now.append(pending)
            result.at_once[topic] += 1
            pending = None
        if pending is None:
            if current is not None or written is not None:
                index.remove(sid)
            continue
        schedules, ids = to_file.setdefault(bucket_of(pending.due_ms), ([], []))
        schedules.append(pending)
        if internal:
            ids.append((None, None))
        else:
            ids.append((sid, pending_digest))
            index.put(sid, IndexEntry(pending.due_ms, pending.delivery_id, pending_digest))

    frames = {bucket: entries_frame(schedules, ids) for bucket, (schedules, ids) in to_file.items()}
    if due_now:
        result.emitted.append(entries_frame(due_now))
    bulk, bulk_topics = [], []
    if has_anonymous:
        if "src_topic" in anonymous:
            bulk_topics.append(anonymous["src_topic"].to_numpy())
            anonymous = anonymous.drop(columns=["src_topic"])
        else:
            bulk_topics.append(np.full(len(anonymous), "", dtype=object))
        bulk.append(anonymous.assign(sid=None, digest=None) if "sid" not in anonymous else anonymous)
    if fresh is not None and len(fresh):
        fresh_later = (fresh["due_ms"] > now_ms).to_numpy()
        digests = np.full(len(fresh), None, dtype=object)
        for i, r in zip(np.flatnonzero(fresh_later), fresh[fresh_later].itertuples(index=False)):
            digests[i] = digest_of_entry(r)
            index.put(bytes(r.sid), IndexEntry(int(r.due_ms), r.delivery_id, digests[i]))
        bulk.append(fresh[ENTRY_COLUMNS].assign(digest=digests, sid=[bytes(s) for s in fresh["sid"]]))
        bulk_topics.append(fresh["src_topic"].to_numpy() if "src_topic" in fresh else
                           np.array([input_topic_of(s) for s in fresh["sid"]], dtype=object))
    if bulk:
        rows = pd.concat(bulk, ignore_index=True) if len(bulk) > 1 else bulk[0]
        outcomes[Outcome.SCHEDULED] += len(rows)
        due_mask = rows["due_ms"] <= now_ms
        topics = pd.Series(np.concatenate(bulk_topics))
        for topic, n in topics.value_counts().items():
            by_topic[(Outcome.SCHEDULED, topic)] += int(n)
        for topic, n in topics[due_mask.to_numpy()].value_counts().items():
            result.at_once[topic] += int(n)
        if due_mask.any():
            result.emitted.append(rows[due_mask].reset_index(drop=True))
        later = rows[~due_mask]
        for bucket, group in later.groupby(later["due_ms"] // BUCKET_MS, sort=False):
            bucket = int(bucket)
            frames[bucket] = pd.concat([frames[bucket], group]) if bucket in frames else group
    to_ripen = []
    for bucket, frame in frames.items():
        frame = frame.reset_index(drop=True)
        info = shard.get(bucket)
        through = None if info is None else info.prepared_through(run)
        if through is not None:
            # Within what this run already prepared of the bucket: emitted here, as the mark says they are
            # (beyond now + window too, if the clock went back since the mark was set).
            covered = frame["due_ms"] <= through
            if covered.any():
                result.emitted.append(frame[covered].reset_index(drop=True))
        if shard.file(bucket, frame):
            to_ripen.append(bucket)
    for bucket in to_ripen:
        result.emitted.extend(shard.ripen(bucket, shard.get(bucket)))
    shard.flush()
    return result


def fire(store: ShardStore, timer_ms: int, now_ms: int, window_ms: int = 0, run: str = "") -> Iterator[pd.DataFrame]:
    """A timer expired at batch time ``now_ms``: ripen each bucket it is the live timer of (see
    ``_Shard.ripen``), yielding what it emits."""
    buckets = store.armed_get(timer_ms)
    if not buckets:
        return
    store.armed_remove(timer_ms)
    shard: Optional[_Shard] = None
    for bucket in sorted(set(buckets)):
        info = store.bucket_get(bucket)
        if info is None or info.timer_ms != timer_ms:
            continue  # emptied, or re-armed since: this timer is stale for it
        if shard is None:
            shard = _Shard(store, store.next_seq(), now_ms, window_ms, run, lazy=True)
        shard.cache[bucket] = info
        yield from shard.ripen(bucket, info)
    if shard is not None:
        shard.flush()


class MemoryShardStore:
    """``ShardStore`` over dicts (tests and tools). Timers are kept as a set of (ms, shard)."""

    def __init__(self, shard: int = 0, timers: Optional[set] = None, cache: Optional[IndexCache] = None):
        self.shard = shard
        self.seq = 0
        self.cache = cache if cache is not None else IndexCache()  # the worker memory: tests swap it
        self.token: Optional[IndexToken] = None
        self.deltas: dict[tuple[int, int], list] = {}
        self.buckets: dict[int, BucketInfo] = {}
        self.chunks: dict[tuple[int, int], pd.DataFrame] = {}
        self.strikes: dict[tuple[int, int], list] = {}
        self.armed: dict[int, list] = {}
        self.timers = timers if timers is not None else set()

    def next_seq(self):
        self.seq += 1
        return self.seq

    def index_token_get(self):
        return None if self.token is None else copy.deepcopy(self.token)

    def index_token_put(self, token):
        self.token = copy.deepcopy(token)

    def delta_get(self, version, part):
        return list(self.deltas[(version, part)])

    def delta_put(self, version, part, changes):
        self.deltas[(version, part)] = list(changes)

    def delta_remove(self, version, part):
        del self.deltas[(version, part)]  # strict: trimming a part that is not there is a bug

    def bucket_items(self):
        return [(bucket, info.copy()) for bucket, info in self.buckets.items()]

    def chunk_index(self, bucket, n):
        return self.chunks[(bucket, n)][["sid", "due_ms", "delivery_id", "digest"]].copy()

    def index_entries(self) -> dict:
        """The index as a rebuild would see it (tests)."""
        from .index_cache import stored_index
        return stored_index(self)

    def bucket_get(self, bucket):
        info = self.buckets.get(bucket)
        # A copy, as a state store would hand back: changes count only once written.
        return None if info is None else info.copy()

    def bucket_put(self, bucket, info):
        self.buckets[bucket] = info.copy()

    def bucket_remove(self, bucket):
        self.buckets.pop(bucket, None)

    def chunk_get(self, bucket, n):
        return self.chunks[(bucket, n)].copy()

    def chunk_put(self, bucket, n, entries):
        self.chunks[(bucket, n)] = entries.copy()

    def chunk_remove(self, bucket, n):
        self.chunks.pop((bucket, n), None)

    def strikes_get(self, bucket, n):
        return list(self.strikes[(bucket, n)])

    def strikes_put(self, bucket, n, delivery_ids):
        self.strikes[(bucket, n)] = list(delivery_ids)

    def strikes_remove(self, bucket, n):
        self.strikes.pop((bucket, n), None)

    def armed_get(self, timer_ms):
        return list(self.armed.get(timer_ms, ()))

    def armed_put(self, timer_ms, buckets):
        self.armed[timer_ms] = list(buckets)

    def armed_remove(self, timer_ms):
        self.armed.pop(timer_ms, None)

    def register_timer(self, timer_ms):
        self.timers.add((timer_ms, self.shard))
