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
  * ``seq``: a per-shard counter, advanced by every handler call that changes the shard;
  * ``paused``: a paused cron's id -> its definition (a one-row chunk), see cron_rules.py;
  * ``levels``: where the shard's buckets are among the coarse levels (``buckets.Levels``).

The index is exact: an entry exists exactly while its version is pending. A request that
replaces, cancels or completes a version rewrites or removes the entry; a fire removes the
entries of what it delivers (``ShardTransaction.forget``, shard.py), in bulk: no state call per schedule.

The rules see a shard's state through ``ShardStore``, implemented over dicts here (``MemoryShardStore``: tests and
tools) and over Spark state in engine/processor/state_store.py.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Protocol

import pandas as pd

from .buckets import BucketInfo
from .entries import with_entry_columns, with_entry_dtypes
from .fields import ENTRY_COLUMNS
from .index_cache import IndexCache, IndexToken, stored_index

# What a rebuild of the index reads of a chunk (``ShardStore.chunk_index``).
CHUNK_INDEX_COLUMNS = ["sid", "due_ms", "delivery_id", "digest"]


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
        """The CHUNK_INDEX_COLUMNS of a chunk."""

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
        return self.chunks[(bucket, n)][CHUNK_INDEX_COLUMNS].copy()

    def index_entries(self) -> dict:
        """The index as a rebuild would see it (tests)."""
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
        # As a chunk read back from its blob: every column, each of its dtype.
        self.chunks[(bucket, n)] = with_entry_dtypes(
            with_entry_columns(entries[[c for c in ENTRY_COLUMNS if c in entries]])
        ).copy()

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
