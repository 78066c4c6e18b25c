"""Where a shard's schedules are filed: time buckets, one second wide or coarse (levels of 64 s, ~68 min, ~3 days,
~194 days), their keys, which bucket holds a due time (``Levels``), and each bucket's metadata (``BucketInfo``, the
``buckets`` state value).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

BUCKET_MS = 1000
FAR_FUTURE_MS = 2**62


# Coarse levels: a schedule due far ahead is filed in a bucket of level L >= 1, LEVEL_FANOUT ** L seconds wide, and
# moves down a level (``ShardTransaction.refine``) one such width before that bucket's start. A bucket costs state
# calls and an Arrow blob whatever it holds; with one-second buckets only, a batch of dues spread over a month (one
# per second) would pay them per request. The levels make that a few hundred buckets per batch.
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


def aligned_lead_ms(lead_ms: int) -> int:
    """A lead of a second or more, rounded up to a power of two seconds. The shards of a herd hold about the same
    bytes; with leads a few ms apart their buckets would fire in different batches, and a batch preparing a shard's
    part of a herd takes seconds: the other shards would start theirs later (when the batch that prepared a herd
    also wrote it, at the instant: a 10M herd a quarter on time, the rest 80 s late)."""
    if lead_ms < 1000:
        return lead_ms
    return 1000 << (-(-lead_ms // 1000) - 1).bit_length()


def _ddl(ddl: str) -> dict:
    """The metadata of a field of the ``buckets`` state value: its Spark SQL type. The state schema (BUCKET_INFO_DDL)
    and the value's row are derived from the fields, in their order."""
    return {"ddl": ddl}


@dataclass
class BucketInfo:
    """A bucket's metadata: the ``buckets`` state value (its schema is in checkpoints: never reorder, retype or rename
    a field; tests/unit/test_stored_formats.py pins it)."""

    created_seq: int = field(metadata=_ddl("long"))
    # the one live timer of the bucket (any other timer naming it is stale)
    timer_ms: int = field(metadata=_ddl("long"))
    # numbers chunks and strike lists; never reused within the bucket
    next_n: int = field(default=0, metadata=_ddl("int"))
    # [(n, bytes)] of the live schedule chunks
    chunks: list = field(default_factory=list, metadata=_ddl("array<struct<n:long,bytes:long>>"))
    # [(n, count)] of the strike lists
    strikes: list = field(default_factory=list, metadata=_ddl("array<struct<n:long,count:long>>"))
    # [(seq, rule time)] of partial fires (no longer read)
    fires: list = field(default_factory=list, metadata=_ddl("array<struct<seq:long,rule_ms:long>>"))
    # The prepare mark: in run ``prep_run``, every schedule of the bucket due by ``prep_through`` was emitted
    # (prepared for the timed writer, or written). Another run's mark means nothing: its writer is gone.
    prep_run: str = field(default="", metadata=_ddl("string"))
    prep_through: int = field(default=-1, metadata=_ddl("long"))

    def copy(self) -> BucketInfo:
        return BucketInfo(*(list(value) if isinstance(value, list) else value for value in self.to_row()))

    def prepared_through(self, run: str) -> int | None:
        return self.prep_through if run and self.prep_run == run else None

    def to_row(self) -> tuple:
        """The state value, field by field."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    @classmethod
    def from_row(cls, row) -> BucketInfo:
        """From the state value (a Row, or any sequence in field order)."""
        return cls(*(_read(f.metadata["ddl"], value) for f, value in zip(dataclasses.fields(cls), row)))


def _read(ddl: str, value):
    """A stored value as BucketInfo holds it: pairs as (int, int) tuples, a null string as ""."""
    if ddl.startswith("array<struct<"):
        return [(int(pair[0]), int(pair[1])) for pair in value or ()]
    if ddl == "string":
        return value or ""
    return int(value)


BUCKET_INFO_DDL = ", ".join(f"{f.name} {f.metadata['ddl']}" for f in dataclasses.fields(BucketInfo))


def record_fire(fires: list, seq: int, rule_ms: int) -> list:
    """Add a fire, keeping only those no later fire with a later rule time makes redundant."""
    return [(s, t) for s, t in fires if t > rule_ms] + [(seq, rule_ms)]
