"""One handler call's transaction on a shard (``ShardTransaction``): what it reads of the shard's state it reads once,
what it changes it writes once (``flush``); it files schedules in their buckets, ripens a bucket whose timer is due
(emits what is due or to be prepared, retires what was delivered), refines a coarse bucket into the level below, and
files the next firing of each cron whose firing left state.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pandas as pd

from ...delivery_ids import activation_of, firing_id
from ...protocol import ENTRY_OVERHEAD_BYTES
from . import buckets
from . import cron as crons
from .buckets import (
    BUCKET_MS,
    FAR_FUTURE_MS,
    BucketInfo,
    Levels,
    aligned_lead_ms,
    bucket_of,
    is_coarse,
    key_at,
    key_range,
    level_of,
    level_width,
    record_fire,
)
from .entries import merge_small, named_rows, schedule_of_entry, split_by_bytes
from .index_cache import IndexEntry, IndexSession
from .store import ShardStore

# A chunk (or strike list) at least half this big is final: never merged again. Bounds every
# state value the layout writes (one schedule bigger than this is a chunk of its own).
SEAL_BYTES = 4 * 1024 * 1024
SEAL_STRIKES = 65_536

# How fast a shard's fire reads, filters and emits a bucket's chunks and the batch keeps them for the herd writer,
# conservatively (docs/measurements.md, the herd's preparation): a bucket is prepared this much earlier per byte it
# holds. A longer lead costs nothing but memory: the batches go on while a prepared herd waits for its instant.
PREPARE_BYTES_PER_S = 1_000_000


class ShardTransaction:
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
        if not buckets.COARSE_LEVELS:  # read here, not imported: tests turn the levels off
            return bucket_of(due_ms)
        return self.levels().locate(due_ms)

    def place(self, rows: pd.DataFrame) -> dict:
        """bucket -> rows: where schedules not due yet are filed. Buckets the levels know to be new are not read."""
        if not buckets.COARSE_LEVELS:  # the one-second layout alone (tests of what happens within a bucket; old state)
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
            skipped = self.missed_skip_firings(frame, emit)
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

    def missed_skip_firings(self, frame: pd.DataFrame, emit: pd.Series) -> pd.Series | None:
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
        return [self._put_chunk(bucket, info, piece) for piece in split_by_bytes(entries, SEAL_BYTES)]

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
        for timer_ms, armed_buckets in self.armed.items():
            self.store.armed_put(timer_ms, armed_buckets)
        levels = self._levels
        if levels is not None and (levels.changed or levels.listed):
            gone = {key for key in levels.listed if key in self.cache and self.cache[key] is None}
            if gone:  # emptied in this call: no need to keep them apart any more
                levels.listed -= gone
                levels.changed = True
            if levels.changed:
                self.store.levels_put(levels.fine_mark, sorted(levels.coarse), sorted(levels.listed))
        self._index.commit()
