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
Spark state in engine/processor/state_store.py.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import hashlib
import itertools
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import pandas as pd

from ...protocol import ENTRY_OVERHEAD_BYTES
from . import cron as crons
from .index_cache import PAUSED_MS, IndexCache, IndexEntry, IndexSession, IndexToken
from .rejection_classes import reason_class
from .schedule import (
    Action,
    Cron,
    Outcome,
    Request,
    Schedule,
    WriteBack,
    activation_of,
    completes,
    firing_id,
    input_topic_of,
    is_cron,
    is_internal,
)

BUCKET_MS = 1000
# How fast a shard's fire reads, filters and emits a bucket's chunks, conservatively: a bucket is prepared this much
# earlier per byte it holds. Measured with the 10M herd with ids on 2 cores: 4 shards of ~250 MB of chunks each,
# emitted in 86 s by one batch (about 3 MB/s per shard: the shards share the cores); a 1M herd's batch read its
# 4 x 25 MB in 10.1 s (2.5 MB/s per shard) in a later run. With ordinary traffic alongside (bench mixed, 2026-11-28)
# the batch preparing a 1M herd took 12.7 s for the state and ~11 s more to keep the herd in Spark for the herd writer
# (1 MB/s per shard): the lead is planned at that rate. A longer lead costs nothing but memory now that the batches
# go on while a prepared herd waits for its instant.
PREPARE_BYTES_PER_S = 1_000_000
FAR_FUTURE_MS = 2**62
# A chunk (or strike list) at least half this big is final: never merged again. Bounds every
# state value the layout writes (one schedule bigger than this is a chunk of its own).
SEAL_BYTES = 4 * 1024 * 1024
SEAL_STRIKES = 65_536
ENTRY_COLUMNS = [
    "due_ms",
    "topic",
    "key",
    "value",
    "headers",
    "delivery_id",
    "entry_bytes",
    # what some dialects add (null for native requests): see schedule.Schedule
    "partition",
    "partition_key",
    "wb_topic",
    "wb_partition",
    "wb_key",
    "wb_headers",
    "history",
    # the client id and digest of the version (null without request id): rebuild the index
    "sid",
    "digest",
    # expiry (null: none), and a cron's definition (null for one-shots): see schedule.Cron
    "max_lateness_ms",
    "cron_expr",
    "cron_tz",
    "cron_policy",
    "cron_start_ms",
    "cron_end_ms",
]
INDEX_COLUMNS = ["sid", "digest"]
CRON_COLUMNS = ["cron_expr", "cron_tz", "cron_policy", "cron_start_ms", "cron_end_ms"]
NULLABLE_INT_COLUMNS = ("partition", "wb_partition", "max_lateness_ms", "cron_start_ms", "cron_end_ms")
DEFAULT_CRON_MIN_INTERVAL_MS = 5000


# Coarse levels: a schedule due far ahead is filed in a bucket of level L >= 1, LEVEL_FANOUT ** L seconds wide, and
# moves down a level (``_Shard.refine``) one such width before that bucket's start. A bucket costs state calls and
# an Arrow blob whatever it holds; with one-second buckets only, a batch of dues spread over a month (one per
# second) paid them per request (~290 requests/s measured). The levels make that a few hundred buckets per batch.
LEVEL_FANOUT = 64
COARSE_LEVELS = 4  # 64 s, ~68 min, ~3 days, ~194 days (further dues: buckets of the top level)
# A second getting this many schedules in one call is a bucket of its own at once, however far ahead: a herd is
# never rewritten on its way down the levels.
DENSE_ROWS = 32
# Coarse bucket keys: above every one-second bucket (|due_ms // BUCKET_MS| < 2**53), level in the low 3 bits.
COARSE_BASE = 1 << 60
COARSE_MIN = 1 << 59
LEVEL_SLOTS = 8  # key = COARSE_BASE + index * LEVEL_SLOTS + level


def bucket_of(due_ms: int) -> int:
    return due_ms // BUCKET_MS


def level_width(level: int) -> int:
    return BUCKET_MS * LEVEL_FANOUT**level


def coarse_key(level: int, index):
    """The key of the level-``level`` bucket number ``index`` (ints or numpy arrays)."""
    return COARSE_BASE + index * LEVEL_SLOTS + level


def is_coarse(key: int) -> bool:
    return key >= COARSE_MIN


def level_of(key: int) -> int:
    return 0 if key < COARSE_MIN else (key - COARSE_BASE) % LEVEL_SLOTS


def key_range(key: int) -> tuple[int, int]:
    """[start, end) in ms of the due times a bucket holds."""
    if key < COARSE_MIN:
        return key * BUCKET_MS, (key + 1) * BUCKET_MS
    level, index = level_of(key), (key - COARSE_BASE) // LEVEL_SLOTS
    width = level_width(level)
    return index * width, (index + 1) * width


def key_at(level: int, due_ms):
    """The key of the bucket of ``level`` holding ``due_ms`` (ints or numpy arrays)."""
    if level == 0:
        return due_ms // BUCKET_MS
    return coarse_key(level, due_ms // level_width(level))


@dataclass
class Levels:
    """Which buckets of a shard are where (the ``levels`` state value), so that a due time names one bucket:

      * the coarse buckets (keys), pairwise disjoint;
      * ``fine_mark``: every one-second bucket not listed lies wholly before it (it only grows);
      * ``listed``: one-second buckets that may lie at or after the mark (dense seconds filed far ahead).

    A schedule due at t is in the coarse bucket holding t if there is one, else in the one-second bucket of t. A
    coarse bucket is created only where it holds no other bucket (at or after the mark, holding nothing listed, not
    within a coarse one), and a one-second bucket only where no coarse bucket holds it, so no two buckets overlap.
    Raising the mark never breaks this: the mark only decides where a *new* coarse bucket may go."""

    fine_mark: int
    coarse: set
    listed: set
    changed: bool = False

    @classmethod
    def rebuilt(cls, keys: Iterable[int]) -> Levels:
        """From the bucket keys in state (a checkpoint written before the levels): one pass over the buckets."""
        coarse, fine_end = set(), None
        for key in keys:
            if is_coarse(key):
                coarse.add(key)
            else:
                fine_end = max(fine_end, (key + 1) * BUCKET_MS) if fine_end is not None else (key + 1) * BUCKET_MS
        mark = -FAR_FUTURE_MS if fine_end is None else -(-fine_end // level_width(1)) * level_width(1)
        return cls(mark, coarse, set(), changed=True)

    def locate(self, due_ms: int) -> int:
        """The key of the bucket that holds a pending schedule due at ``due_ms``."""
        if self.coarse:
            for level in range(1, COARSE_LEVELS + 1):
                key = key_at(level, due_ms)
                if key in self.coarse:
                    return key
        return due_ms // BUCKET_MS

    def raise_mark(self, mark_ms: int) -> None:
        if mark_ms > self.fine_mark:
            self.fine_mark = mark_ms
            self.changed = True
            below = {key for key in self.listed if (key + 1) * BUCKET_MS <= mark_ms}
            self.listed -= below

    def place(self, due: np.ndarray, now_ms: int, window_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys of the buckets new schedules (due after now) go to, and which of those buckets are new (none in
        state: no read needed). See the class docstring for why each choice keeps buckets disjoint."""
        n = len(due)
        keys = np.empty(n, dtype=np.int64)
        new = np.zeros(n, dtype=bool)
        placed = np.zeros(n, dtype=bool)
        # Seconds whose level-1 bucket would be refined at once are no use coarse: raising the mark over them also
        # drops the listing of seconds now behind it.
        width1 = level_width(1)
        self.raise_mark(-(-(now_ms + window_ms + width1 + 1) // width1) * width1)
        if self.coarse:
            coarse = np.fromiter(self.coarse, dtype=np.int64, count=len(self.coarse))
            for level in range(1, COARSE_LEVELS + 1):
                at = key_at(level, due)
                hit = ~placed & np.isin(at, coarse)
                keys[hit], placed[hit] = at[hit], True
        fine = due // BUCKET_MS
        below = ~placed & (due < self.fine_mark)
        keys[below], placed[below] = fine[below], True
        if self.listed:
            hit = ~placed & np.isin(fine, np.fromiter(self.listed, dtype=np.int64, count=len(self.listed)))
            keys[hit], placed[hit] = fine[hit], True
        if placed.all():
            return keys, new
        seconds, counts = np.unique(fine[~placed], return_counts=True)
        dense = ~placed & np.isin(fine, seconds[counts >= DENSE_ROWS])
        if dense.any():
            self._list(fine[dense])
            keys[dense], new[dense], placed[dense] = fine[dense], True, True
        for level in range(COARSE_LEVELS, 0, -1):
            if placed.all():
                break
            width = level_width(level)
            index = due // width
            start = index * width
            ok = ~placed & (start >= self.fine_mark) & (start - width - window_ms > now_ms)
            if not ok.any():
                continue
            blocked = self._held(level)
            if blocked:
                ok &= ~np.isin(index, np.fromiter(blocked, dtype=np.int64, count=len(blocked)))
            at = coarse_key(level, index[ok])
            keys[ok], new[ok], placed[ok] = at, True, True
            self.coarse.update(int(k) for k in np.unique(at))
            self.changed = True
        if not placed.all():
            # A sparse second next to a listed one (no coarse bucket may hold that): listed too.
            rest = ~placed
            self._list(fine[rest])
            keys[rest], new[rest] = fine[rest], True
        return keys, new

    def _list(self, seconds: np.ndarray) -> None:
        self.listed.update(int(s) for s in np.unique(seconds))
        self.changed = True

    def _held(self, level: int) -> set:
        """Indexes of the level-``level`` buckets that hold a listed second or a coarse bucket of a lower level."""
        width = level_width(level)
        held = {key * BUCKET_MS // width for key in self.listed}
        for key in self.coarse:
            if level_of(key) < level:
                held.add(key_range(key)[0] // width)
        return held


def _part(pieces: list, data: bytes | None) -> None:
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


def _native_digest(due_ms: int, topic: str, key: bytes | None, value: bytes | None, header_list):
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
    bytes; with leads a few ms apart their buckets would fire in different batches, and a batch preparing a shard's
    part of a herd takes seconds: the other shards would start theirs later (when the batch that prepared a herd
    also wrote it, at the instant: a 10M herd a quarter on time, the rest 80 s late)."""
    if lead_ms < 1000:
        return lead_ms
    return 1000 << (-(-lead_ms // 1000) - 1).bit_length()


def digest_of_entry(r) -> bytes:
    """``digest(schedule_of_entry(r))``, without making the Schedule for a native row (the ingest path)."""
    if (
        missing(r.partition)
        and missing(r.partition_key)
        and missing(r.wb_headers)
        and not flag(r.history)
        and missing(getattr(r, "max_lateness_ms", None))
        and missing(getattr(r, "cron_expr", None))
    ):
        return _native_digest(
            int(r.due_ms),
            r.topic,
            optional_bytes(r.key),
            optional_bytes(r.value),
            [(name, optional_bytes(value)) for name, value in header_pairs(r.headers)],
        ).digest()
    return digest(schedule_of_entry(r))


def digest(schedule: Schedule) -> bytes:
    """What makes two versions "strictly identical": due time, destination, key, value, headers. Stored in
    checkpoints (chunk rows, the index): the encoding must never change."""
    h = _native_digest(schedule.due_ms, schedule.topic, schedule.key, schedule.value, schedule.headers)
    if (
        schedule.partition is not None
        or schedule.partition_key is not None
        or schedule.write_back is not None
        or schedule.history
    ):
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
    if schedule.max_lateness_ms is not None or schedule.cron is not None:
        # Added with issue 19: digests of schedules without expiry and crons stay as they were.
        pieces = [b"c", struct.pack(">q", -1 if schedule.max_lateness_ms is None else schedule.max_lateness_ms)]
        definition = schedule.cron
        if definition is not None:
            _part(pieces, definition.expr.encode())
            _part(pieces, None if definition.tz is None else definition.tz.encode())
            _part(pieces, definition.policy.encode())
            for bound in (definition.start_ms, definition.end_ms):
                pieces.append(b"\xff" if bound is None else struct.pack(">q", bound))
        h.update(b"".join(pieces))
    return h.digest()


def cron_digest(schedule: Schedule) -> bytes:
    """What makes two cron definitions identical (an identical CRON_ADD is a no-op): all but the firing instant and
    the ids."""
    return digest(dataclasses.replace(schedule, due_ms=0, delivery_id=""))


def entry_bytes(schedule: Schedule) -> int:
    """Rough stored size, to bound chunks (the decoder computes the same in Spark SQL)."""

    def header_bytes(pairs) -> int:
        return sum(len(name.encode()) + len(value or b"") for name, value in pairs)

    back = schedule.write_back
    definition = schedule.cron
    return (
        ENTRY_OVERHEAD_BYTES
        + len(schedule.key or b"")
        + len(schedule.value or b"")
        + header_bytes(schedule.headers)
        + (0 if back is None else len(back.key or b"") + header_bytes(back.headers))
        + (0 if definition is None else len(definition.expr.encode()) + len((definition.tz or "").encode()))
    )


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

    def copy(self) -> BucketInfo:
        return BucketInfo(
            self.created_seq,
            self.timer_ms,
            self.next_n,
            list(self.chunks),
            list(self.strikes),
            list(self.fires),
            self.prep_run,
            self.prep_through,
        )

    def prepared_through(self, run: str) -> int | None:
        return self.prep_through if run and self.prep_run == run else None


def record_fire(fires: list, seq: int, rule_ms: int) -> list:
    """Add a fire, keeping only those no later fire with a later rule time makes redundant."""
    return [(s, t) for s, t in fires if t > rule_ms] + [(seq, rule_ms)]


class ShardStore(Protocol):
    """The state of one shard."""

    cache: IndexCache  # the worker's copy of this shard's index

    def next_seq(self) -> int: ...
    def index_token_get(self) -> IndexToken | None: ...
    def index_token_put(self, token: IndexToken) -> None: ...
    def delta_get(self, version: int, part: int) -> list: ...
    def delta_put(self, version: int, part: int, changes: list) -> None: ...
    def delta_remove(self, version: int, part: int) -> None: ...
    def bucket_items(self) -> Iterator[tuple[int, BucketInfo]]: ...
    def bucket_keys(self) -> Iterator[int]: ...
    def chunk_index(self, bucket: int, n: int) -> pd.DataFrame:
        """Columns sid, due_ms, delivery_id, digest of a chunk (what a rebuild of the index reads)."""

    def bucket_get(self, bucket: int) -> BucketInfo | None: ...
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
    # Paused crons: sid -> a one-row entries frame (its definition; due_ms: where a replay resumes, delivery_id: the
    # activation it was paused in). Few: a state call per pause and resume.
    def paused_get(self, sid: bytes) -> pd.DataFrame | None: ...
    def paused_put(self, sid: bytes, entry: pd.DataFrame) -> None: ...
    def paused_remove(self, sid: bytes) -> None: ...
    def paused_items(self) -> Iterator[tuple[bytes, pd.DataFrame]]: ...
    # Where the buckets are (``Levels``): (fine_mark, coarse keys, listed keys); None before the first write.
    def levels_get(self) -> tuple[int, list, list] | None: ...
    def levels_put(self, fine_mark: int, coarse: list, listed: list) -> None: ...


def entries_frame(schedules: Iterable[Schedule], ids: Iterable[tuple] | None = None) -> pd.DataFrame:
    """``ids``: (sid, digest) of each schedule; None: schedules without request id."""
    rows = []
    for s, (sid, version_digest) in zip(schedules, ids if ids is not None else itertools.repeat((None, None))):
        back, definition = s.write_back, s.cron
        rows.append(
            (
                s.due_ms,
                s.topic,
                s.key,
                s.value,
                list(s.headers),
                s.delivery_id,
                entry_bytes(s),
                s.partition,
                s.partition_key,
                *(
                    (None, None, None, None)
                    if back is None
                    else (back.topic, back.partition, back.key, list(back.headers))
                ),
                s.history,
                sid,
                version_digest,
                s.max_lateness_ms,
                *(
                    (None,) * 5
                    if definition is None
                    else (definition.expr, definition.tz, definition.policy, definition.start_ms, definition.end_ms)
                ),
            )
        )
    if not rows:
        return _NO_ENTRIES.copy()
    frame = pd.DataFrame(rows, columns=ENTRY_COLUMNS)
    # Column by column, and only those pandas made numeric: astype with a mapping concatenates every column again
    # (2.3 of the 3.6 ms a call took; a batch of the model tests makes several).
    for column in NULLABLE_INT_COLUMNS:
        if frame[column].dtype != object:
            frame[column] = frame[column].astype(object)
    return frame


_NO_ENTRIES = pd.DataFrame([], columns=ENTRY_COLUMNS)


def with_entry_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame with every entry column: those a chunk written before them lacks are null."""
    absent = [c for c in ENTRY_COLUMNS if c not in frame.columns]
    if not absent:
        return frame
    return frame.assign(**{c: pd.Series([None] * len(frame), index=frame.index, dtype=object) for c in absent})


def missing(value) -> bool:
    """A null cell of a frame: pandas holds a missing one as None, NaN in a numeric column, or pd.NA in a nullable
    integer one."""
    return value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value))


def optional_int(value) -> int | None:
    """An int cell of a frame: pandas may hold a missing one as None, NaN or pd.NA."""
    return None if value is None or pd.isna(value) else int(value)


def optional_bytes(value) -> bytes | None:
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


def cron_of_entry(r) -> Cron | None:
    expr = getattr(r, "cron_expr", None)
    if missing(expr):
        return None
    tz, policy = getattr(r, "cron_tz", None), getattr(r, "cron_policy", None)
    return Cron(
        expr,
        None if missing(tz) else tz,
        "replay" if missing(policy) else policy,
        optional_int(getattr(r, "cron_start_ms", None)),
        optional_int(getattr(r, "cron_end_ms", None)),
    )


@functools.lru_cache(maxsize=256)
def _row_type(columns: tuple) -> type:
    return collections.namedtuple("Row", columns, rename=True)


# Rows converted at a time by ``named_rows``: a whole frame at once held ~45 MB per 100,000 entries.
NAMED_ROWS_SLICE = 1024


def named_rows(frame: pd.DataFrame) -> Iterator[tuple]:
    """``frame.itertuples(index=False)`` without the namedtuple class it builds on every call (about 1 ms each, most
    of a small batch's rules), and with Python ints where it gives numpy ones (nullable int columns)."""
    row = _row_type(tuple(frame.columns))
    for start in range(0, len(frame), NAMED_ROWS_SLICE):
        yield from map(row._make, frame.iloc[start : start + NAMED_ROWS_SLICE].to_numpy(dtype=object).tolist())


def schedule_of_entry(r) -> Schedule:
    """A Schedule from a row (``named_rows``) of an entries frame or of the processor's request frame (a CRON_ADD's due
    time is null there: 0)."""
    wb_headers = getattr(r, "wb_headers", None)
    return Schedule(
        optional_int(r.due_ms) or 0,
        r.topic,
        optional_bytes(r.key),
        optional_bytes(r.value),
        headers_of(r.headers),
        r.delivery_id,
        partition=optional_int(getattr(r, "partition", None)),
        partition_key=optional_bytes(getattr(r, "partition_key", None)),
        write_back=None
        if missing(wb_headers)
        else WriteBack(r.wb_topic, int(r.wb_partition), optional_bytes(r.wb_key), headers_of(wb_headers)),
        history=flag(getattr(r, "history", False)),
        max_lateness_ms=optional_int(getattr(r, "max_lateness_ms", None)),
        cron=cron_of_entry(r),
    )


def schedules_of(frame: pd.DataFrame) -> list[Schedule]:
    return [schedule_of_entry(r) for r in named_rows(frame)]


def _empty() -> pd.DataFrame:
    return pd.DataFrame(columns=ENTRY_COLUMNS)


def split_by_bytes(frame: pd.DataFrame, limit: int | None = None) -> list[pd.DataFrame]:
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
    return [frame.iloc[a:b].reset_index(drop=True) for a, b in itertools.pairwise(cuts)]


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


def step(pending, pending_digest: bytes | None, request: Request):
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

    def __init__(
        self,
        store: ShardStore,
        seq: int,
        now_ms: int,
        window_ms: int,
        run: str,
        lazy: bool = False,
        started_ms: int | None = None,
    ):
        self.store, self.seq, self.now_ms, self.window_ms, self.run = store, seq, now_ms, window_ms, run
        # When the running job started: a skip cron's firing due before it was missed (the job was down).
        self.started_ms = started_ms
        self.cache: dict[int, BucketInfo | None] = {}
        self.dirty: set[int] = set()
        self.armed: dict[int, list] = {}
        self.struck: dict[int, list] = {}
        # Firings of crons that left state in this call (written, delivered, expired or skipped), with ``_after``:
        # the instant their next firing follows (advance_crons files it).
        self.cron_gone: list[pd.DataFrame] = []
        self.skipped = 0  # firings of skip crons missed while the job was down: not delivered
        # Synced before the call changes anything: a rebuild reads the chunks as the last call left them.
        # One state read when the cache is current. A fire's is lazy: it only forgets (IndexSession.forget), unless
        # it files a cron's next firing: then it is rebuilt from the chunks as this call has left them so far.
        self._index = IndexSession(store, lazy=lazy, overlay=lambda: dict(self.cache))
        self._levels: Levels | None = None
        self.refined: set = set()  # coarse buckets this call refined

    def index(self) -> IndexSession:
        return self._index

    def levels(self) -> Levels:
        """Read once per call, when the call locates or files a schedule."""
        if self._levels is None:
            stored = self.store.levels_get()
            if stored is None:
                self._levels = Levels.rebuilt(self.store.bucket_keys())
            else:
                self._levels = Levels(int(stored[0]), set(stored[1]), set(stored[2]))
        return self._levels

    def locate(self, due_ms: int) -> int:
        if not COARSE_LEVELS:
            return bucket_of(due_ms)
        return self.levels().locate(due_ms)

    def place(self, rows: pd.DataFrame) -> dict:
        """bucket -> rows: where schedules not due yet are filed. Buckets the levels know to be new are not read."""
        if not COARSE_LEVELS:  # the one-second layout alone (tests of what happens within a bucket; old state)
            return {int(key): group for key, group in rows.groupby(rows["due_ms"] // BUCKET_MS, sort=False)}
        keys, new = self.levels().place(rows["due_ms"].to_numpy(dtype=np.int64), self.now_ms, self.window_ms)
        for key in np.unique(keys[new]).tolist():
            self.cache.setdefault(key, None)
        return {int(key): group for key, group in rows.groupby(keys, sort=False)}

    def forget(self, delivered: pd.DataFrame) -> None:
        """Schedules leave state: their ids leave the index (recorded in this call's delta, in bulk). Call it
        wherever entries leave state for good (delivered, or prepared and retired): an id re-filed since keeps
        its newer entry. Written with the rest at ``flush``."""
        sids = delivered["sid"]
        with_id = sids.notna().to_numpy()
        if with_id.any():
            self.index().forget(sids[with_id], delivered["delivery_id"][with_id])

    def get(self, bucket: int) -> BucketInfo | None:
        if bucket not in self.cache:
            self.cache[bucket] = self.store.bucket_get(bucket)
        return self.cache[bucket]

    def written(self, entry: IndexEntry) -> bool:
        """Prepared in this run and due by now: the timed writer has written it (the sink makes sure before the
        batch commits), though the bucket, and so the index, still hold it until a fire retires it."""
        info = self.get(self.locate(entry.due_ms))
        through = None if info is None else info.prepared_through(self.run)  # a coarse bucket is never prepared
        return through is not None and entry.due_ms <= through and entry.due_ms <= self.now_ms

    def may_be_held(self, entry: IndexEntry) -> bool:
        """Whether the timed writer may hold this pending version (prepared in this run, not yet due)."""
        info = self.get(self.locate(entry.due_ms))
        through = None if info is None else info.prepared_through(self.run)
        return through is not None and entry.due_ms <= through

    def strike(self, entry: IndexEntry) -> None:
        self.struck.setdefault(self.locate(entry.due_ms), []).append(entry.delivery_id)

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
        if is_coarse(bucket):
            # Refined one width of its level before it starts: its buckets of the level below are then all
            # armed ahead of their own instants.
            level = level_of(bucket)
            timer_ms = key_range(bucket)[0] - level_width(level) - self.window_ms - self.lead_ms(info)
        else:
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
        retire_at: int | None = None  # the earliest due time of what stays prepared
        prepare_at: int | None = None  # the earliest due time of what stays unprepared
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
            skipped = self._skipped(frame, emit)
            if skipped is not None:
                emit &= ~skipped
            if emit.any():
                yield frame[emit].reset_index(drop=True)
            gone = due <= now
            if gone.any():
                leaving.append(frame.loc[gone, ["sid", "delivery_id"]])
                self._cron_leaving(frame[gone])
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
                self.index().forget_due(
                    bucket * BUCKET_MS,
                    (bucket + 1) * BUCKET_MS - 1,
                    sum(int(frame["sid"].notna().sum()) for frame in leaving),
                )
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
        self.arm(
            bucket,
            info,
            min(
                t
                for t in (retire_at, None if prepare_at is None else max(now + 1, prepare_at - self.window_ms - lead))
                if t is not None
            ),
        )
        self.dirty.add(bucket)

    def refine(self, bucket: int, info: BucketInfo) -> Iterator[pd.DataFrame]:
        """A coarse bucket one width of its level before its start: its schedules (less those struck) move to the
        buckets of the level below (a level of seconds: the usual buckets), which take over its place among the
        levels. Nothing is emitted but what those buckets emit if already due (a late timer). No schedule leaves
        state, so the index is untouched."""
        level, (_start, end) = level_of(bucket), key_range(bucket)
        levels = self.levels()
        struck: set = set(self.struck.pop(bucket, ()))
        for n, _ in info.strikes:
            struck.update(self.store.strikes_get(bucket, n))
            self.store.strikes_remove(bucket, n)
        levels.coarse.discard(bucket)
        levels.changed = True
        self.refined.add(bucket)
        if level == 1:
            levels.raise_mark(end)  # its seconds are now ordinary (unlisted) one-second buckets
        self.cache[bucket] = None
        self.dirty.discard(bucket)
        self.store.bucket_remove(bucket)
        pieces, pieces_bytes = [], 0
        for n, _ in info.chunks:
            frame = self.store.chunk_get(bucket, n)
            self.store.chunk_remove(bucket, n)
            if struck:
                frame = frame[~frame["delivery_id"].isin(struck)]
            if not len(frame):
                continue
            pieces.append(frame)
            pieces_bytes += int(frame["entry_bytes"].sum())
            if pieces_bytes >= SEAL_BYTES:  # bounded memory: a herd in a coarse bucket moves a few chunks at a time
                yield from self._move_down(level, pieces)
                pieces, pieces_bytes = [], 0
        if pieces:
            yield from self._move_down(level, pieces)

    def _move_down(self, level: int, pieces: list) -> Iterator[pd.DataFrame]:
        rows = pd.concat(pieces, ignore_index=True) if len(pieces) > 1 else pieces[0].reset_index(drop=True)
        yield from self.file_frames(self._children(level, rows))

    def _children(self, level: int, rows: pd.DataFrame) -> dict:
        """bucket -> rows: the buckets one level below ``level`` that take the rows of a bucket refined; a child
        refined already by this call (its timer was past) hands its share further down."""
        keys = key_at(level - 1, rows["due_ms"].to_numpy(dtype=np.int64))
        frames = {}
        levels = self.levels()
        for key, group in rows.groupby(keys, sort=False):
            key = int(key)
            if key in self.refined:
                frames.update(self._children(level - 1, group))
                continue
            self.cache.setdefault(key, None)  # nothing else lies within a coarse bucket: not read
            if level > 1 and key not in levels.coarse:
                levels.coarse.add(key)
            frames[key] = group
        return frames

    def _skipped(self, frame: pd.DataFrame, emit: pd.Series) -> pd.Series | None:
        """The firings of skip crons about to be emitted that were missed: due before the running job started (it was
        down, or starting, at their instant). Not delivered; the cron goes on from its first firing since the start.
        A firing late because of a slow batch or a backlog was due while the job ran: it is delivered.
        Not "due by now" too: a batch the job before left unfinished is run again with that job's batch time, which
        may be earlier than such a firing (then it would be prepared, and written late, when it was missed)."""
        if self.started_ms is None or not emit.any():
            return None
        due = frame["due_ms"]
        missed = emit & (frame["cron_policy"] == "skip") & (due < self.started_ms)
        if not missed.any():
            return None
        self.skipped += int(missed.sum())
        return missed

    def _cron_leaving(self, rows: pd.DataFrame) -> None:
        """Firings leaving state: those of crons get their next firing (``advance_crons``), after their own instant, or
        after the job's start for a skipped one."""
        is_cron = rows["cron_expr"].notna()
        if not is_cron.any():
            return
        fired = rows[is_cron]
        after = fired["due_ms"].to_numpy(dtype=np.int64)
        if self.started_ms is not None:
            # A skip cron's firings due before the running job started were missed, whatever became of the one
            # leaving (skipped; or prepared in a batch run again with an earlier batch time, and written since).
            skip = (fired["cron_policy"] == "skip").to_numpy(dtype=bool)
            after = np.where(skip, np.maximum(after, self.started_ms - 1), after)
        self.cron_gone.append(fired.assign(_after=after))

    def advance_crons(self) -> Iterator[pd.DataFrame]:
        """Each cron whose firing left state in this call gets its next one, computed in bulk (rows sharing expression,
        zone and instant share one computation): filed in its bucket (the index names it), or, when already due
        (a replay after an outage or a pause), emitted at once and followed in turn, in order. A cron with no next
        firing (past its end) leaves state. Yields what it emits."""
        while self.cron_gone:
            gone = (
                pd.concat(self.cron_gone, ignore_index=True)
                if len(self.cron_gone) > 1
                else self.cron_gone[0].reset_index(drop=True)
            )
            self.cron_gone = []
            following = crons.next_firings(
                gone["cron_expr"].to_numpy(), gone["cron_tz"].to_numpy(), gone["_after"].to_numpy()
            )
            ends = pd.to_numeric(gone["cron_end_ms"], errors="coerce").fillna(float(FAR_FUTURE_MS)).to_numpy()
            alive = (following >= 0) & (following <= ends)
            if not alive.any():
                continue
            nexts = gone[alive].drop(columns=["_after"]).reset_index(drop=True)
            nexts["due_ms"] = following[alive]
            nexts["delivery_id"] = [
                firing_id(activation_of(d), t) for d, t in zip(nexts["delivery_id"], nexts["due_ms"])
            ]
            due = (nexts["due_ms"] <= self.now_ms).to_numpy()
            if due.any():
                at_once = nexts[due].reset_index(drop=True)
                yield at_once
                self.cron_gone.append(at_once.assign(_after=at_once["due_ms"].to_numpy(dtype=np.int64)))
            later = nexts[~due]
            if len(later):
                index = self.index()
                for sid, due_ms, delivery_id, version_digest in zip(
                    later["sid"], later["due_ms"], later["delivery_id"], later["digest"]
                ):
                    index.put(bytes(sid), IndexEntry(int(due_ms), delivery_id, bytes(version_digest)))
                yield from self.file_frames(self.place(later))

    def file_frames(self, frames: dict) -> Iterator[pd.DataFrame]:
        """File schedules not yet due (bucket -> entries); yields what is emitted meanwhile: those within what this
        run already prepared of their bucket, and what the buckets due for preparation emit when ripened."""
        to_ripen = []
        for bucket, frame in frames.items():
            frame = frame.reset_index(drop=True)
            info = self.get(bucket)
            through = None if info is None else info.prepared_through(self.run)
            if through is not None:
                # Within what this run already prepared of the bucket: emitted here, as the mark says they are
                # (beyond now + window too, if the clock went back since the mark was set).
                covered = frame["due_ms"] <= through
                if covered.any():
                    yield frame[covered].reset_index(drop=True)
            if self.file(bucket, frame):
                to_ripen.append(bucket)
        for bucket in to_ripen:
            info = self.get(bucket)
            if info is None:  # a coarse bucket refined meanwhile (by a refine of this loop): moved on already
                continue
            yield from (self.refine if is_coarse(bucket) else self.ripen)(bucket, info)

    def rows_by_delivery_id(self, wanted: dict) -> dict:
        """bucket -> delivery ids: the Schedules of those rows (a cron's definition, read when it is paused)."""
        found = {}
        for bucket, ids in wanted.items():
            info = self.get(bucket)
            for n, _ in info.chunks if info is not None else ():
                frame = self.store.chunk_get(bucket, n)
                for r in named_rows(frame[frame["delivery_id"].isin(ids)]):
                    found[r.delivery_id] = schedule_of_entry(r)
        return found

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
            info.strikes = merge_small(
                info.strikes,
                SEAL_STRIKES,
                lambda a, b, bucket=bucket, info=info: self._merge_strikes(bucket, info, a, b),
            )
            self.dirty.add(bucket)
        for bucket in self.dirty:
            if self.cache[bucket] is not None:
                self.store.bucket_put(bucket, self.cache[bucket])
        for timer_ms, buckets in self.armed.items():
            self.store.armed_put(timer_ms, buckets)
        levels = self._levels
        if levels is not None and (levels.changed or levels.listed):
            gone = {key for key in levels.listed if key in self.cache and self.cache[key] is None}
            if gone:  # emptied in this call: no need to keep them apart any more
                levels.listed -= gone
                levels.changed = True
            if levels.changed:
                self.store.levels_put(levels.fine_mark, sorted(levels.coarse), sorted(levels.listed))
        self._index.commit()


@dataclass
class BatchResult:
    """What one handler call hands to the sink."""

    outcomes: Counter = field(default_factory=Counter)
    # The same outcomes per input topic, (Outcome, topic) -> n (rejections: (Outcome.REJECTED, topic, reason class)),
    # and the schedules delivered at once (due when read) per input topic: for the metrics (ops/metrics.py).
    by_topic: Counter = field(default_factory=Counter)
    at_once: Counter = field(default_factory=Counter)
    # entries frames: due by now (write now) or later (prepared); a row marked ``expired`` (mark_expired) is not
    # delivered but rejected as expired
    emitted: list = field(default_factory=list)
    withdrawn: list = field(default_factory=list)  # delivery ids the timed writer may hold and must drop
    # CRON_ADDs the rules refuse (expression, zone, interval): frames of key, value, raw_headers, delivery_id, reason
    rejected: list = field(default_factory=list)
    skipped: int = 0  # firings of skip crons missed while the job was down

    def schedules(self) -> list[Schedule]:
        """Every emitted schedule, expired ones too."""
        return [s for frame in self.emitted for s in schedules_of(frame)]


def mark_expired(frame: pd.DataFrame, now_ms: int) -> pd.DataFrame:
    """Rows written at ``now_ms`` later than their due time plus their max lateness get ``expired`` True (the
    column appears only when one does): the sink and the timed writer reject them as expired. A row prepared
    ahead (due after now) is judged again when the writer writes it."""
    lateness = frame.get("max_lateness_ms")
    if lateness is None or not len(frame):
        return frame
    limit = pd.to_numeric(lateness, errors="coerce")
    if limit.isna().all():
        return frame
    late = (now_ms - frame["due_ms"].astype("int64") > limit).fillna(False).to_numpy(dtype=bool)
    if not late.any():
        return frame
    return frame.assign(expired=late)


def expired_mask(frame: pd.DataFrame) -> np.ndarray:
    if "expired" not in frame:
        return np.zeros(len(frame), dtype=bool)
    return frame["expired"].fillna(False).to_numpy(dtype=bool)


def _rejection_frame(rows: list) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["key", "value", "raw_headers", "delivery_id", "reason"])


def _reject(result: BatchResult, topic: str, rows: list) -> None:
    """CRON_ADDs refused by the rules: (key, value, raw headers, delivery id, reason) each."""
    for row in rows:
        result.outcomes[Outcome.REJECTED] += 1
        result.by_topic[(Outcome.REJECTED, topic, reason_class(row[4]))] += 1
    result.rejected.append(_rejection_frame(rows))


def cron_digest_of_entry(r) -> bytes:
    """``cron_digest(schedule_of_entry(r))`` without the Schedule (the bulk path of CRON_ADDs)."""
    return cron_digest(schedule_of_entry(r))


def _cron_requests(
    shard: _Shard, by_sid: dict, result: BatchResult, to_file: tuple[list, list], min_interval_ms: int
) -> None:
    """The requests of crons, per id in log order (see protocols.md, "Recurring schedules"). A cron's state is its one
    pending firing in the wheel (the index names it), or, paused, its definition in the ``paused`` map (the index
    entry's due time is PAUSED_MS). A version's firing that the timed writer may hold is withdrawn and struck out of
    its bucket when the cron is paused, replaced or cancelled; a firing already written stays written."""
    index, store, now = shard.index(), shard.store, shard.now_ms
    outcomes, by_topic = result.outcomes, result.by_topic
    # A pause of an active cron needs its definition: the row of its pending firing, read from its bucket (grouped).
    wanted: dict = {}
    for sid, requests in by_sid.items():
        entry = index.get(sid)
        if entry is not None and entry.due_ms != PAUSED_MS and any(r.action is Action.CRON_PAUSE for r in requests):
            wanted.setdefault(shard.locate(entry.due_ms), set()).add(entry.delivery_id)
    rows = shard.rows_by_delivery_id(wanted) if wanted else {}

    for sid, requests in by_sid.items():
        topic = input_topic_of(sid)
        initial = index.get(sid)
        kind = "none" if initial is None else "paused" if initial.due_ms == PAUSED_MS else "active"
        written = kind == "active" and shard.written(initial)
        version: Schedule | None = None  # the cron as this batch left it (active: due_ms its first firing;
        version_digest = None if initial is None else initial.digest  # paused: due_ms where a replay resumes)
        changed = False
        replayed_id = None  # a replay due at once: its first firing's id (replayed_firing_id)

        for request in requests:
            action = request.action
            if action is Action.CRON_ADD:
                schedule = request.schedule
                definition = schedule.cron
                reason = crons.problem(definition.expr, definition.tz, min_interval_ms)
                if reason is not None:
                    _reject(
                        result,
                        topic,
                        [
                            (
                                schedule.key,
                                schedule.value,
                                request.raw_headers,
                                request.activation or schedule.delivery_id,
                                reason,
                            )
                        ],
                    )
                    continue
                new_digest = cron_digest(schedule)
                if kind == "active" and new_digest == version_digest:
                    outcome = Outcome.CRON_REPLACE_NOOP
                else:
                    outcome = Outcome.CRON_ADDED if kind == "none" else Outcome.CRON_REPLACED
                    first = crons.first_firing(
                        definition.expr, definition.tz, now, definition.start_ms, definition.end_ms
                    )
                    activation = request.activation or schedule.delivery_id
                    changed, version_digest, replayed_id = True, new_digest, None
                    if first is None:  # nothing left to fire (past its end): registered and gone
                        kind, version = "none", None
                    else:
                        kind, written = "active", False
                        version = dataclasses.replace(schedule, due_ms=first, delivery_id=firing_id(activation, first))
            elif action is Action.CRON_PAUSE:
                if kind != "active":
                    outcome = Outcome.CRON_PAUSE_NOOP
                else:
                    outcome = Outcome.CRON_PAUSED
                    # the definition as it stands, its due time the pending firing
                    base = version if changed else rows[initial.delivery_id]
                    cursor = base.due_ms
                    if written:  # its pending firing is written: the next one is where a replay would resume
                        following = crons.spec(base.cron.expr, base.cron.tz).next_after(cursor)
                        cursor = FAR_FUTURE_MS if following is None else following
                    kind, changed, replayed_id = "paused", True, None
                    version = dataclasses.replace(base, due_ms=cursor, delivery_id=activation_of(base.delivery_id))
            elif action is Action.CRON_RESUME:
                if kind != "paused":
                    outcome = Outcome.CRON_RESUME_NOOP
                else:
                    outcome = Outcome.CRON_RESUMED
                    # the definition as it stands, its due time the cursor where a replay resumes
                    base = version if changed else schedule_of_entry(next(named_rows(store.paused_get(sid))))
                    first = resumed_at(base.cron, base.due_ms, now)
                    changed = True
                    if first is None:
                        kind, version = "none", None
                    else:
                        kind, written = "active", False
                        version = dataclasses.replace(
                            base, due_ms=first, delivery_id=firing_id(request.activation, first)
                        )
                        replayed_id = replayed_firing_id(base.delivery_id, first)
            elif action is Action.CRON_CANCEL:
                if kind == "none":
                    outcome = Outcome.CRON_CANCEL_NOOP
                else:
                    outcome = Outcome.CRON_CANCELLED
                    kind, version, changed = "none", None, True
            else:
                raise ValueError(f"not a cron action: {action}")
            outcomes[outcome] += 1
            by_topic[(outcome, topic)] += 1

        if not changed:
            continue
        if initial is not None:
            if initial.due_ms == PAUSED_MS:
                if kind != "paused":
                    store.paused_remove(sid)
            else:
                withdraw_firing(shard, initial, written, result)
        if kind == "none":
            if initial is not None:
                index.remove(sid)
        elif kind == "paused":
            store.paused_put(sid, entries_frame([version], [(sid, version_digest)]))
            index.put(sid, IndexEntry(PAUSED_MS, version.delivery_id, version_digest))
        elif version.due_ms <= now:  # a replay: due at once, and those after it in turn (advance_crons)
            frame = entries_frame([version], [(sid, version_digest)])
            result.emitted.append(frame.assign(delivery_id=[replayed_id or version.delivery_id]))
            shard.cron_gone.append(frame.assign(_after=frame["due_ms"].to_numpy(dtype=np.int64)))
            if initial is not None:
                index.remove(sid)
        else:
            schedules, ids = to_file
            schedules.append(version)
            ids.append((sid, version_digest))
            index.put(sid, IndexEntry(version.due_ms, version.delivery_id, version_digest))


def replayed_firing_id(paused_activation: str, first_ms: int) -> str | None:
    """The id of the first firing a replay delivers at once when a cron resumes: the one the pause withdrew, so the
    id it had in the activation the cron was paused in. A withdrawal reaches the timed writer only at the end of the
    pausing batch; if that batch was still running at the firing's instant, the writer had written it, and the
    replay is then a duplicate with the same id (at-least-once), not a second firing with another id. The firings
    after it carry the resume's activation."""
    return firing_id(paused_activation, first_ms)


def resumed_at(definition: Cron, cursor: int, now_ms: int) -> int | None:
    """The first firing of a resumed cron: with ``replay``, the first one the pause withdrew (``cursor``; those due
    are delivered at once, in order), with ``skip`` the first after now. None: none left (past its end)."""
    if definition.policy == "skip":
        return crons.first_firing(
            definition.expr, definition.tz, max(now_ms, cursor - 1), definition.start_ms, definition.end_ms
        )
    end = FAR_FUTURE_MS if definition.end_ms is None else definition.end_ms
    return cursor if cursor <= end else None


def withdraw_firing(shard: _Shard, entry: IndexEntry, written: bool, result: BatchResult) -> None:
    """A cron paused, replaced or cancelled: its pending firing is struck out of its bucket (even when written:
    retiring it would otherwise file the next firing of that version), and withdrawn from the timed writer if it
    may hold it."""
    shard.strike(entry)
    if not written and shard.may_be_held(entry):
        result.withdrawn.append(entry.delivery_id)


def _fresh_cron_adds(
    shard: _Shard, adds: pd.DataFrame, result: BatchResult, min_interval_ms: int
) -> pd.DataFrame | None:
    """CRON_ADDs of ids without a cron that no other request of the batch names (the usual registration), in bulk:
    one validation and one first-firing computation per distinct definition, not per row. Returns the entries to
    file (due_ms the first firing)."""
    now = shard.now_ms
    topics = (
        adds["src_topic"].to_numpy()
        if "src_topic" in adds
        else np.array([input_topic_of(s) for s in adds["sid"]], dtype=object)
    )
    exprs, zones = adds["cron_expr"].to_numpy(), adds["cron_tz"].to_numpy()
    reasons = np.array(
        _per_distinct(lambda e, z: crons.problem(e, None if missing(z) else z, min_interval_ms), exprs, zones),
        dtype=object,
    )
    bad = pd.notna(reasons)
    if bad.any():
        for topic in pd.unique(topics[bad]):
            of_topic = bad & (topics == topic)
            _reject(
                result,
                str(topic),
                list(
                    zip(
                        adds["key"][of_topic],
                        adds["value"][of_topic],
                        adds["raw_headers"][of_topic],
                        adds["delivery_id"][of_topic],
                        reasons[of_topic],
                    )
                ),
            )
    good = adds[~bad].reset_index(drop=True)
    if not len(good):
        return None
    for topic, n in pd.Series(topics[~bad]).value_counts().items():
        result.by_topic[(Outcome.CRON_ADDED, topic)] += int(n)
    result.outcomes[Outcome.CRON_ADDED] += len(good)
    keys = list(zip(good["cron_expr"], good["cron_tz"], good["cron_start_ms"], good["cron_end_ms"]))
    firsts: dict = {}
    for key in set(map(_hashable, keys)):
        expr, tz, start, end = key
        first = crons.first_firing(expr, tz, now, start, end)
        firsts[key] = -1 if first is None else first
    due = np.array([firsts[_hashable(k)] for k in keys], dtype=np.int64)
    filed = good[due >= 0].assign(due_ms=due[due >= 0]).reset_index(drop=True)
    if not len(filed):
        return None
    filed["delivery_id"] = [firing_id(d, t) for d, t in zip(filed["delivery_id"], filed["due_ms"])]
    filed["digest"] = [cron_digest_of_entry(r) for r in named_rows(filed)]
    filed["sid"] = [bytes(s) for s in filed["sid"]]
    index = shard.index()
    for sid, due_ms, delivery_id, version_digest in zip(
        filed["sid"], filed["due_ms"], filed["delivery_id"], filed["digest"]
    ):
        index.put(sid, IndexEntry(int(due_ms), delivery_id, version_digest))
    return filed[ENTRY_COLUMNS]


def _hashable(key: tuple) -> tuple:
    expr, tz, start, end = key
    return expr, None if missing(tz) else tz, optional_int(start), optional_int(end)


def _per_distinct(function, exprs, zones) -> list:
    results: dict = {}
    out = []
    for e, z in zip(exprs, zones):
        key = (e, None if missing(z) else z)
        if key not in results:
            results[key] = function(e, z)
        out.append(results[key])
    return out


def apply_requests(
    store: ShardStore,
    requests: Iterable[tuple[bytes, Request]],
    now_ms: int,
    anonymous: pd.DataFrame | None = None,
    window_ms: int = 0,
    run: str = "",
    keyed: pd.DataFrame | None = None,
    cron_adds: pd.DataFrame | None = None,
    started_ms: int | None = None,
    cron_min_interval_ms: int = DEFAULT_CRON_MIN_INTERVAL_MS,
) -> BatchResult:
    """One shard's requests of a micro-batch at batch time ``now_ms``.

    Emits the schedules due by ``now_ms`` once all of the batch's requests acted (they leave state), and
    prepares those due by ``now_ms + window_ms``: emitted for the timed writer of run ``run`` but kept in
    state until a fire after their due time retires them, so a crash before the writer wrote them loses
    nothing. A replace or cancel of a version the writer may hold withdraws it.

    ``requests`` are those with a client id (one-shots and crons), in log order per id. ``anonymous`` holds the ADDs
    without request id (ENTRY_COLUMNS): nothing can replace or cancel them, so they skip the
    index and are filed in bulk (an optional ``src_topic`` column names their input topic for the counts
    per topic; their ids are not kept). ``keyed`` (ENTRY_COLUMNS, digest not needed) holds ADDs and
    REPLACEs with a client id that no other request of the batch names: those whose id has no
    pending version (the usual case) are filed in bulk too, without a Schedule per row (``src_topic``, optional,
    as for ``anonymous``). ``cron_adds`` (ENTRY_COLUMNS and ``raw_headers``) holds CRON_ADDs likewise.
    ``started_ms``: when the running job started (skip crons' firings due before it were missed).
    """
    by_sid: dict[bytes, list[Request]] = {}
    for sid, request in requests:
        by_sid.setdefault(sid, []).append(request)
    has_anonymous = anonymous is not None and len(anonymous) > 0
    has_keyed = keyed is not None and len(keyed) > 0
    has_cron_adds = cron_adds is not None and len(cron_adds) > 0
    result = BatchResult()
    if not by_sid and not has_anonymous and not has_keyed and not has_cron_adds:
        return result

    shard = _Shard(store, store.next_seq(), now_ms, window_ms, run, started_ms=started_ms)
    outcomes, by_topic = result.outcomes, result.by_topic
    due_now: list[Schedule] = []
    to_file: tuple[list[Schedule], list[tuple]] = ([], [])  # not due yet: (schedules, (sid, digest) of each)
    index = shard.index()
    fresh = fresh_crons = None
    if has_keyed or has_cron_adds:
        entries = index.entries()
    if has_keyed:
        known = np.fromiter((bytes(sid) in entries for sid in keyed["sid"]), dtype=bool, count=len(keyed))
        for r in named_rows(keyed[known]):  # a version is pending: the rules, one by one
            by_sid[bytes(r.sid)] = [Request(Action(r.action), schedule_of_entry(r))]
        fresh = keyed[~known]
    if has_cron_adds:
        known = np.fromiter((bytes(sid) in entries for sid in cron_adds["sid"]), dtype=bool, count=len(cron_adds))
        for r in named_rows(cron_adds[known]):  # a cron has the id (active or paused): one by one
            by_sid[bytes(r.sid)] = [
                Request(Action.CRON_ADD, schedule_of_entry(r), raw_headers=r.raw_headers, activation=r.delivery_id)
            ]
        fresh_crons = cron_adds[~known]
    cron_sids = {sid: of_sid for sid, of_sid in by_sid.items() if is_cron(sid)}
    for sid, of_sid in by_sid.items():
        if sid in cron_sids:
            continue
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
        schedules, ids = to_file
        schedules.append(pending)
        if internal:
            ids.append((None, None))
        else:
            ids.append((sid, pending_digest))
            index.put(sid, IndexEntry(pending.due_ms, pending.delivery_id, pending_digest))
    if cron_sids:
        _cron_requests(shard, cron_sids, result, to_file, cron_min_interval_ms)

    to_place = [entries_frame(*to_file)] if to_file[0] else []
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
        for i, r in zip(np.flatnonzero(fresh_later), named_rows(fresh[fresh_later])):
            digests[i] = digest_of_entry(r)
            index.put(bytes(r.sid), IndexEntry(int(r.due_ms), r.delivery_id, digests[i]))
        bulk.append(fresh[ENTRY_COLUMNS].assign(digest=digests, sid=[bytes(s) for s in fresh["sid"]]))
        bulk_topics.append(
            fresh["src_topic"].to_numpy()
            if "src_topic" in fresh
            else np.array([input_topic_of(s) for s in fresh["sid"]], dtype=object)
        )
    if bulk:
        rows = pd.concat(bulk, ignore_index=True) if len(bulk) > 1 else bulk[0]
        rows = with_entry_columns(rows)
        outcomes[Outcome.SCHEDULED] += len(rows)
        due_mask = rows["due_ms"] <= now_ms
        topics = np.concatenate(bulk_topics)
        # Counted in Python: a small batch's value_counts cost ~0.7 ms each (missing topics left out, as there).
        for topic, n in Counter(topics.tolist()).items():
            if not missing(topic):
                by_topic[(Outcome.SCHEDULED, topic)] += n
        for topic, n in Counter(topics[due_mask.to_numpy()].tolist()).items():
            if not missing(topic):
                result.at_once[topic] += n
        if due_mask.any():
            result.emitted.append(rows[due_mask].reset_index(drop=True))
        later = rows[~due_mask]
        if len(later):
            to_place.append(later)
    if fresh_crons is not None and len(fresh_crons):
        filed = _fresh_cron_adds(shard, fresh_crons, result, cron_min_interval_ms)
        if filed is not None:
            to_place.append(filed)
    if to_place:
        # All of the call's schedules placed at once: which seconds are dense is judged over all of them.
        rows = pd.concat(to_place, ignore_index=True) if len(to_place) > 1 else to_place[0]
        result.emitted.extend(shard.file_frames(shard.place(rows)))
    result.emitted.extend(shard.advance_crons())
    result.emitted = [mark_expired(frame, now_ms) for frame in result.emitted]
    result.skipped = shard.skipped
    shard.flush()
    return result


def fire(
    store: ShardStore,
    timer_ms: int,
    now_ms: int,
    window_ms: int = 0,
    run: str = "",
    started_ms: int | None = None,
    counts: Counter | None = None,
) -> Iterator[pd.DataFrame]:
    """A timer expired at batch time ``now_ms``: ripen each bucket it is the live timer of (see
    ``_Shard.ripen``), yielding what it emits (rows written later than their max lateness marked ``expired``), then
    the next firings of the crons whose firing left state. ``counts``: gets the firings skipped (``skipped``)."""
    buckets = store.armed_get(timer_ms)
    if not buckets:
        return
    store.armed_remove(timer_ms)
    shard: _Shard | None = None
    for bucket in sorted(set(buckets)):
        info = store.bucket_get(bucket)
        if info is None or info.timer_ms != timer_ms:
            continue  # emptied, or re-armed since: this timer is stale for it
        if shard is None:
            shard = _Shard(store, store.next_seq(), now_ms, window_ms, run, lazy=True, started_ms=started_ms)
        shard.cache[bucket] = info
        for frame in (shard.refine if is_coarse(bucket) else shard.ripen)(bucket, info):
            yield mark_expired(frame, now_ms)
    if shard is not None:
        for frame in shard.advance_crons():
            yield mark_expired(frame, now_ms)
        if counts is not None and shard.skipped:
            counts["skipped"] += shard.skipped
        shard.flush()


class MemoryShardStore:
    """``ShardStore`` over dicts (tests and tools). Timers are kept as a set of (ms, shard)."""

    def __init__(self, shard: int = 0, timers: set | None = None, cache: IndexCache | None = None):
        self.shard = shard
        self.seq = 0
        self.cache = cache if cache is not None else IndexCache()  # the worker memory: tests swap it
        self.token: IndexToken | None = None
        self.deltas: dict[tuple[int, int], list] = {}
        self.buckets: dict[int, BucketInfo] = {}
        self.chunks: dict[tuple[int, int], pd.DataFrame] = {}
        self.strikes: dict[tuple[int, int], list] = {}
        self.armed: dict[int, list] = {}
        self.paused: dict[bytes, pd.DataFrame] = {}
        self.levels: tuple[int, list, list] | None = None
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

    def bucket_keys(self):
        return list(self.buckets)

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
        self.chunks[(bucket, n)] = with_entry_columns(entries[[c for c in ENTRY_COLUMNS if c in entries]]).copy()

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

    def paused_get(self, sid):
        entry = self.paused.get(bytes(sid))
        return None if entry is None else entry.copy()

    def paused_put(self, sid, entry):
        self.paused[bytes(sid)] = entry.copy()

    def paused_remove(self, sid):
        self.paused.pop(bytes(sid), None)

    def paused_items(self):
        return [(sid, entry.copy()) for sid, entry in self.paused.items()]

    def levels_get(self):
        return None if self.levels is None else (self.levels[0], list(self.levels[1]), list(self.levels[2]))

    def levels_put(self, fine_mark, coarse, listed):
        self.levels = (fine_mark, list(coarse), list(listed))
