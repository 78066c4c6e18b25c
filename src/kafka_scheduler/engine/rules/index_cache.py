"""The id index of a shard, held in the Python worker's memory and checked against state once per call.

A point lookup in state costs a round trip to the JVM (~100-150 µs), which capped ingest with
request ids near 6,600/s. Here each request costs a dict lookup; each handler call a constant few
state calls. RocksDB stays the source of truth: the memory copy is only a cache, and every change
to it is also written to state, as

  * ``index_token`` (one ValueState): the shard's index version, a random nonce per version still
    in the delta log (``nonces[v - base]``), the number of changes of each retained version, and the
    number of entries;
  * ``index_deltas`` (MapState (version, part) -> changes): one call's changes to the index,
    in parts of at most ``DELTA_PART`` changes, for versions ``base + 1 .. version``.

A cache is trusted only if its (version, nonce) is one the token still lists. The nonce is what
catches a cache made by a task attempt whose state was never committed: the attempt re-run on the
other worker writes the same version number with another nonce. A cache behind the token applies
the deltas it missed (the shard's task moves between worker processes from batch to batch); one
too far behind (deltas trimmed), ahead of it, or with the wrong nonce is rebuilt from the stored
chunks, whose rows carry their id (``sid``) and ``digest``. A chunk row counts unless struck.

The index is exact: an entry exists exactly while its version is pending. Delivered versions leave
it (``IndexSession.forget``) in the same call that takes them out of state, recorded in that call's
delta in bulk. A whole bucket retired at once leaves it as one change, ``(None, (first_ms, last_ms))``:
every entry due in that range goes (``IndexSession.forget_due``), so retiring a herd of millions
neither reads its chunks back nor writes a change per id.

The cache holds each entry as a plain tuple, and hands out ``IndexEntry`` views of it. PySpark's daemon runs a full
collection of the cyclic garbage collector after every task a worker runs, and that collection visits every object
it tracks: a NamedTuple stays tracked for good, while CPython stops tracking an exact tuple of ints, strings and
bytes at the first collection that sees it. With 10,000,000 pending the NamedTuples made the collections take
two thirds of the workers' time, a cost per batch that grew with what is pending (docs/measurements.md).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

log = logging.getLogger(__name__)

DELTA_PART = 50_000  # changes per stored delta value: bounds every value the log writes
KEEP_VERSIONS = 64  # deltas kept at most; a cache further behind is rebuilt
KEEP_CHANGES_FLOOR = 100_000  # the log also keeps at most max(this, entries) changes: catching up stays
# cheaper than a rebuild, which reads every pending entry
# The due time in the index entry of a paused cron: it has no firing in the wheel (its definition is in the
# ``paused`` map); far below any due time, so no range of due times (forget_due) ever holds it.
PAUSED_MS = -(2**62)


class IndexEntry(NamedTuple):
    """Where the pending version of a client id is, and what it is (for the identical-replace no-op). The cache
    stores it as a plain tuple (``stored``): see the module's docstring."""

    due_ms: int
    delivery_id: str
    digest: bytes  # its bucket: the one holding due_ms (buckets.Levels)


DUE_MS, DELIVERY_ID = IndexEntry._fields.index("due_ms"), IndexEntry._fields.index("delivery_id")


def stored(entry: IndexEntry) -> tuple:
    """How the cache holds an entry: an exact tuple, which the cyclic garbage collector stops tracking."""
    return tuple(entry)


@dataclass
class IndexToken:
    version: int = 0
    base: int = 0  # the oldest version a cache may be at and still catch up
    nonces: list = field(default_factory=lambda: [0])  # of versions base .. version
    sizes: list = field(default_factory=list)  # changes of versions base + 1 .. version
    entries: int = 0


@dataclass
class IndexCache:
    """One shard's index in one worker process. ``nonce`` None: not to be trusted (being changed, or new)."""

    version: int = 0
    nonce: int | None = None
    entries: dict = field(default_factory=dict)
    rebuilds: int = 0
    repairs: int = 0  # rebuilds because the entry count disagreed with the token: a bug if ever non-zero


# The worker's caches, by shard. A module-level object of an imported module outlives the task.
CACHES: dict = {}


def cache_for(shard: int) -> IndexCache:
    cache = CACHES.get(shard)
    if cache is None:
        cache = CACHES[shard] = IndexCache()
    return cache


def parts_of(size: int) -> int:
    return (size + DELTA_PART - 1) // DELTA_PART


def stored_index(store, overlay: dict | None = None) -> dict:
    """The index as the stored chunks and strike lists define it: every unstruck row with an id, and every paused
    cron. ``overlay``: bucket -> BucketInfo (None: gone) of a handler call that changed buckets and has not written
    their metadata yet (its chunks and strike lists are written as it goes)."""
    entries: dict = {}
    buckets = dict(store.bucket_items())
    for bucket, info in (overlay or {}).items():
        if info is None:
            buckets.pop(bucket, None)
        else:
            buckets[bucket] = info
    for bucket, info in buckets.items():
        struck: set = set()
        for n, _ in info.strikes:
            struck.update(store.strikes_get(bucket, n))
        for n, _ in info.chunks:
            rows = store.chunk_index(bucket, n)
            # Whole columns as Python lists, zipped in C: a rebuild reads every pending entry of the shard.
            keep = rows["sid"].notna().to_numpy()
            if struck:
                keep &= ~rows["delivery_id"].isin(struck).to_numpy()
            kept = rows[keep]
            entries.update(
                zip(
                    map(bytes, kept["sid"].tolist()),
                    zip(
                        kept["due_ms"].astype("int64").tolist(),
                        kept["delivery_id"].tolist(),
                        map(bytes, kept["digest"].tolist()),
                    ),
                )
            )
    for sid, entry in store.paused_items():
        row = entry.iloc[0]
        entries[bytes(sid)] = stored(IndexEntry(PAUSED_MS, row["delivery_id"], bytes(row["digest"])))
    return entries


def _drop_due(entries: dict, first_ms: int, last_ms: int) -> int:
    gone = [sid for sid, entry in entries.items() if first_ms <= entry[DUE_MS] <= last_ms]
    for sid in gone:
        del entries[sid]
    return len(gone)


def apply_changes(entries: dict, changes: list) -> None:
    """One part of the delta log onto a cache, in order. A part of entries only (an ingest's, up to ``DELTA_PART``)
    goes in with one ``dict.update``: after an ingest of millions, a worker that had not run the shard's last tasks
    catches up millions of changes: 1.3-1.5 µs each with the decode, against 5.3 µs one by one (docs/measurements.md).
    The store hands entries as plain tuples (``stored``); any other form takes the path one by one."""
    if all(sid is not None and type(entry) is tuple for sid, entry in changes):
        entries.update(changes)
        return
    for sid, entry in changes:
        if sid is None:
            _drop_due(entries, *entry)
        elif entry is None:
            entries.pop(sid, None)
        else:
            entries[sid] = stored(entry)


def _rebuild(store, cache: IndexCache, token: IndexToken, overlay: dict | None = None) -> None:
    cache.nonce = None
    # An empty index needs no reading: a shard of schedules without ids may hold millions of them.
    cache.entries = stored_index(store, overlay) if token.entries or overlay else {}
    cache.version, cache.nonce = token.version, token.nonces[-1]
    cache.rebuilds += 1


class IndexSession:
    """One handler call's use of the index: synced at open, changes recorded, written once at ``commit``."""

    def __init__(self, store, lazy: bool = False, overlay=None):
        """``lazy`` (a fire's): on a worker that never held this index, do not sync at all (see ``forget``).
        Otherwise the session syncs at open, before the call changes any chunk: a rebuild must read the
        chunks as the last call left them. A stale cache is caught up or rebuilt as usual, which keeps the
        entry count known (the job logs it)."""
        self.store = store
        self.overlay = overlay  # () -> the calling handler's unwritten bucket metadata (see stored_index)
        self.cache: IndexCache = store.cache
        self.token: IndexToken = store.index_token_get() or IndexToken()
        self.changes: list = []
        self._synced = False
        self._invalidate = False
        self._forgotten_unsynced = 0  # entries forgotten while invalidating: the count stays known
        if not (lazy and self._fresh()):
            self._ensure()

    def _fresh(self) -> bool:
        """A worker that never held this shard's index (after a restart)."""
        cache = self.cache
        return cache.nonce is None and cache.version == 0 and not cache.entries and not cache.rebuilds

    def _ensure(self) -> None:
        if not self._synced:
            if self._invalidate:
                # A lazy session that already forgot versions without the index (see ``forget``) now needs it (a
                # cron's next firing is filed): rebuilt from the chunks as this call has left them so far, which no
                # longer hold what it forgot; the commit then starts a new base no other cache can catch up to.
                _rebuild(self.store, self.cache, self.token, self.overlay() if self.overlay else None)
            else:
                self._sync()
            self._synced = True

    def entries(self) -> dict:
        """sid -> the entry as stored (a plain tuple): for membership; ``get`` gives an ``IndexEntry``."""
        self._ensure()
        return self.cache.entries

    @staticmethod
    def trusted(cache: IndexCache, token: IndexToken) -> bool:
        """Whether the cache is the index at a version the token lists (and can be caught up from there)."""
        return (
            cache.nonce is not None
            and token.base <= cache.version <= token.version
            and token.nonces[cache.version - token.base] == cache.nonce
        )

    def _sync(self) -> None:
        cache, token = self.cache, self.token
        if not self.trusted(cache, token):
            _rebuild(self.store, cache, token)
            return
        entries = cache.entries
        while cache.version < token.version:
            version = cache.version + 1
            cache.nonce = None  # half applied, if a read fails
            for part in range(parts_of(token.sizes[version - token.base - 1])):
                apply_changes(entries, self.store.delta_get(version, part))
            cache.version, cache.nonce = version, token.nonces[version - token.base]
        if token.entries >= 0 and len(entries) != token.entries:
            log.warning(
                "index of shard %s: %d entries cached, %d stored: rebuilt from the chunks",
                getattr(self.store, "shard", "?"),
                len(entries),
                token.entries,
            )
            cache.repairs += 1
            _rebuild(self.store, cache, token)

    def get(self, sid: bytes) -> IndexEntry | None:
        self._ensure()
        entry = self.cache.entries.get(sid)
        return None if entry is None else IndexEntry._make(entry)

    def put(self, sid: bytes, entry: IndexEntry) -> None:
        self._ensure()
        self.cache.nonce = None
        self.cache.entries[sid] = stored(entry)
        self.changes.append((sid, entry))

    def remove(self, sid: bytes) -> None:
        self._ensure()
        self.cache.nonce = None
        del self.cache.entries[sid]
        self.changes.append((sid, None))

    def forget(self, sids: Iterable, delivery_ids: Iterable) -> None:
        """Delivered versions leave the index (an id re-filed since keeps its newer entry).

        In a lazy session of a worker that never held this index (a new worker after a restart), the forgetting is
        not worth a rebuild from every chunk before the first overdue delivery goes out: the call instead
        invalidates every cache (``commit``), and the next call that needs the index rebuilds it from the
        chunks, which no longer hold these versions."""
        if not self._synced:  # lazy, and a worker that never held this index: see above
            # Each given sid is a live chunk entry, so (one live entry per id) an index entry: the count stays
            # known without the index, which keeps the pending gauge right after a fire on a fresh worker.
            self._invalidate = True
            self._forgotten_unsynced += len(sids)
            return
        self._ensure()
        entries = self.cache.entries
        for sid, delivery_id in zip(sids, delivery_ids):
            sid = bytes(sid)
            entry = entries.get(sid)
            if entry is not None and entry[DELIVERY_ID] == delivery_id:
                self.remove(sid)

    def forget_due(self, first_ms: int, last_ms: int, live_with_id: int) -> None:
        """Every version due from ``first_ms`` to ``last_ms`` leaves the index, as one change however many they
        are (the caller retires all of them from state in this call; ``live_with_id`` of them carry an id). Like
        ``forget``, a lazy session on a fresh worker invalidates instead."""
        if not self._synced:
            self._invalidate = True
            self._forgotten_unsynced += live_with_id
            return
        self._ensure()
        if _drop_due(self.cache.entries, first_ms, last_ms):
            self.cache.nonce = None
            self.changes.append((None, (first_ms, last_ms)))

    @property
    def synced(self) -> bool:
        """Whether this call holds the index (a lazy session on a fresh worker does not, until it is read)."""
        return self._synced

    def __len__(self) -> int:
        self._ensure()
        return len(self.cache.entries)

    def commit(self) -> None:
        """Write this call's changes as the next version (nothing if there were none)."""
        token, store, changes = self.token, self.store, self.changes
        version, nonce = token.version + 1, secrets.randbits(63)
        if self._invalidate:
            # No cache but maybe this call's lists this version: every other is rebuilt on its next use.
            for base in range(token.base + 1, token.version + 1):
                for part in range(parts_of(token.sizes[base - token.base - 1])):
                    store.delta_remove(base, part)
            if self._synced:  # rebuilt in this call after the forgetting (``_ensure``): exact
                entries = len(self.cache.entries)
                self.cache.version, self.cache.nonce = version, nonce
            else:  # the count stays known (see ``forget``), or unknown till the next rebuild
                entries = token.entries - self._forgotten_unsynced if token.entries >= 0 else -1
            self.token = IndexToken(version, version, [nonce], [], entries if entries >= 0 else -1)
            store.index_token_put(self.token)
            self.changes = []
            return
        recount = self._synced and token.entries < 0
        if not changes and not recount:
            return
        for part in range(parts_of(len(changes))):
            store.delta_put(version, part, changes[part * DELTA_PART : (part + 1) * DELTA_PART])
        base, nonces, sizes = token.base, token.nonces + [nonce], token.sizes + [len(changes)]
        entries = len(self.cache.entries)
        kept = sum(sizes)
        while len(sizes) > 1 and (len(sizes) > KEEP_VERSIONS or kept > max(KEEP_CHANGES_FLOOR, entries)):
            base += 1
            for part in range(parts_of(sizes[0])):
                store.delta_remove(base, part)
            kept -= sizes.pop(0)
            nonces.pop(0)
        self.token = IndexToken(version, base, nonces, sizes, entries)
        store.index_token_put(self.token)
        self.changes = []
        self.cache.version, self.cache.nonce = version, nonce
