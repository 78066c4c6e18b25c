"""The wheel layout's costs are bounded by what a batch does, not by what a bucket holds.

Counted with an instrumented in-memory store (state values and the ids or bytes they carry),
never timed. Each bound is one the old layout broke: it kept every struck id of a bucket in
one value rewritten by every batch that struck, and added a chunk per batch without limit.
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.rules import buckets as bucket_layout
from kafka_scheduler.engine.rules import index_cache
from kafka_scheduler.engine.rules import shard as shard_transaction
from kafka_scheduler.engine.rules.batch import apply_requests, fire
from kafka_scheduler.engine.rules.buckets import bucket_of
from kafka_scheduler.engine.rules.digests import digest
from kafka_scheduler.engine.rules.entries import entries_frame, schedules_of, split_by_bytes
from kafka_scheduler.engine.rules.index_cache import IndexCache
from kafka_scheduler.engine.rules.schedule import Action, Outcome, Request, Schedule
from kafka_scheduler.engine.rules.shard import ShardTransaction
from kafka_scheduler.engine.rules.store import MemoryShardStore

from .model_examples import scaled
from .test_schedule_rules import WheelEngine, check_script, cron_scripts, scripts

DUE = 3_600_000  # one bucket, far ahead


class CountingStore(MemoryShardStore):
    """Counts what crosses the state interface, as a state server round trip would carry it."""

    def __init__(self):
        super().__init__()
        self.strike_ids_moved = 0
        self.calls = Counter()

    def strikes_get(self, bucket, n):
        ids = super().strikes_get(bucket, n)
        self.strike_ids_moved += len(ids)
        self.calls["strikes_get"] += 1
        return ids

    def strikes_put(self, bucket, n, delivery_ids):
        self.strike_ids_moved += len(delivery_ids)
        self.calls["strikes_put"] += 1
        super().strikes_put(bucket, n, delivery_ids)

    def chunk_get(self, bucket, n):
        self.calls["chunk_get"] += 1
        return super().chunk_get(bucket, n)

    def chunk_put(self, bucket, n, entries):
        self.calls["chunk_put"] += 1
        super().chunk_put(bucket, n, entries)


def schedule(i: int, value: bytes = b"v", due: int = DUE, partition: int = 0) -> Schedule:
    return Schedule(due, "out", f"k{i}".encode(), value, (), f"t-{partition}-{i}")


def sid(i: int) -> bytes:
    return f"id:requests/{i}".encode()


def test_a_strike_costs_in_proportion_to_the_batch_not_the_bucket():
    store = CountingStore()
    pending, batches, per_batch = 20_000, 100, 100
    apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i))) for i in range(pending)], 0)
    moved_per_batch = []
    for b in range(batches):
        before = store.strike_ids_moved
        requests = []
        for i in range(b * per_batch, (b + 1) * per_batch):
            requests.append(
                (
                    sid(i),
                    Request(Action.CANCEL, None)
                    if i % 2
                    else Request(Action.REPLACE, schedule(i, b"new", due=DUE + 1, partition=1)),
                )
            )
        counts = apply_requests(store, requests, 1 + b).outcomes
        assert sum(counts.values()) == per_batch
        moved_per_batch.append(store.strike_ids_moved - before)
    strikes = batches * per_batch
    # Geometric merging writes each struck id once, then reads and rewrites it at most once per
    # doubling: 2 log2(batches) + 1 times. The old layout read and rewrote the bucket's whole struck
    # set in every batch: about strikes * batches in all (1,000,000 here).
    assert sum(moved_per_batch) <= strikes * (2 * math.log2(batches) + 2), sum(moved_per_batch)
    [info] = store.buckets.values()
    assert len(info.strikes) <= math.log2(strikes) + 2
    # The struck versions never go out; the replacements and the untouched ones do.
    delivered = [s for frame in fire(store, min(store.armed), DUE + 1) for s in schedules_of(frame)]
    assert Counter(s.value for s in delivered) == Counter({b"new": strikes // 2, b"v": pending - strikes})
    cancelled = {f"k{i}".encode() for i in range(1, strikes, 2)}
    assert not [s for s in delivered if s.key in cancelled]


def test_a_bucket_filled_by_many_batches_keeps_few_bounded_chunks(monkeypatch):
    monkeypatch.setattr(shard_transaction, "SEAL_BYTES", 4096)
    # Sparse rows (3 a batch) an hour ahead would go to a coarse bucket, which fills the same way; the one-second
    # layout keeps the fire's count of reads below exact.
    monkeypatch.setattr(bucket_layout, "COARSE_LEVELS", 0)
    store = CountingStore()
    total = 0
    for b in range(2_000):
        frame = entries_frame([schedule(b * 3 + j, b"x" * (5 + b % 40)) for j in range(3)])
        total += int(frame["entry_bytes"].sum())
        apply_requests(store, [], b, frame)
    [info] = store.buckets.values()
    sealed = [c for c in info.chunks if c[1] >= shard_transaction.SEAL_BYTES // 2]
    unsealed = [c for c in info.chunks if c[1] < shard_transaction.SEAL_BYTES // 2]
    assert len(sealed) <= total / (shard_transaction.SEAL_BYTES // 2)
    assert len(unsealed) <= math.log2(shard_transaction.SEAL_BYTES) + 1
    assert all(size < 2 * shard_transaction.SEAL_BYTES for _, size in info.chunks)
    assert sum(size for _, size in info.chunks) == total
    assert set(store.chunks) == {(bucket_of(DUE), n) for n, _ in info.chunks}, "a merged chunk was left behind"

    # The fire makes a few state calls per chunk and hands deliveries out a chunk at a time.
    store.calls.clear()
    frames = list(fire(store, min(store.armed), DUE))
    assert sum(len(f) for f in frames) == 6_000
    assert all(int(f["entry_bytes"].sum()) < 2 * shard_transaction.SEAL_BYTES for f in frames)
    assert store.calls["chunk_get"] == len(info.chunks)
    assert store.buckets == {} and store.chunks == {}


def test_a_partial_fire_writes_what_is_left_in_bounded_chunks(monkeypatch):
    monkeypatch.setattr(shard_transaction, "SEAL_BYTES", 2048)
    store = MemoryShardStore()
    schedules = [schedule(i, b"y" * 40, due=DUE + i % 1000) for i in range(3_000)]
    apply_requests(store, [], 0, entries_frame(schedules))
    due = [s for f in fire(store, min(store.armed), DUE + 499) for s in schedules_of(f)]
    assert len(due) == 1_500 and all(s.due_ms <= DUE + 499 for s in due)
    [info] = store.buckets.values()
    assert all(size < 2 * shard_transaction.SEAL_BYTES for _, size in info.chunks)
    assert sum(len(store.chunks[(bucket_of(DUE), n)]) for n, _ in info.chunks) == 1_500
    assert list(store.armed) == [DUE + 500]


@pytest.mark.parametrize("values", [[10, 5000, 10], [5000], [300] * 20, [1] * 200, [2000, 2000, 1]])
def test_a_slice_goes_over_the_limit_by_at_most_its_last_row(values):
    frame = entries_frame([schedule(i, b"z" * size) for i, size in enumerate(values)])
    pieces = split_by_bytes(frame, 1024)
    assert [k for p in pieces for k in p["key"]] == list(frame["key"])  # all rows, in order
    for piece in pieces:
        sizes = list(piece["entry_bytes"])
        assert sum(sizes[:-1]) < 1024


@settings(
    max_examples=scaled(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=scripts)
def test_rules_still_match_the_reference_with_tiny_chunks_and_strike_lists(monkeypatch, script):
    """Splitting, sealing and merging at every turn changes nothing the protocol can see."""
    monkeypatch.setattr(shard_transaction, "SEAL_BYTES", 160)
    monkeypatch.setattr(shard_transaction, "SEAL_STRIKES", 4)
    check_script(script, WheelEngine)


# ---------------------------------------------------------------- the id index in worker memory
#
# The index of a shard lives in the worker's memory (``index_cache``) and is checked against state
# once per call. ``WorkersEngine`` plays what Spark does to that memory between batches: the shard's
# task runs on either of two workers (two caches over one store), the job restarts (fresh caches),
# and a task attempt runs, changes its worker's cache, and is thrown away (its state never committed)
# before the batch runs again, on the same worker or the other.

WORKER_MOVES = ["same", "same", "other", "restart", "abort, same", "abort, other"]


class WorkersEngine(WheelEngine):
    def __init__(self, lookahead_ms=0, partitions=2, checkpoint=None, plan=("same",), caches=None):
        super().__init__(lookahead_ms, partitions, checkpoint)
        self.plan, self.turn = plan, 0
        self.caches = caches or [[IndexCache(), IndexCache()] for _ in self.stores]
        self.worker = 0
        self._use_worker(0)

    def _use_worker(self, worker: int) -> None:
        self.worker = worker
        for store, caches in zip(self.stores, self.caches):
            store.cache = caches[worker]

    def _snapshot(self):
        return set(self.timers), [
            (
                s.seq,
                copy.deepcopy(s.token),
                copy.deepcopy(s.deltas),
                {b: i.copy() for b, i in s.buckets.items()},
                {k: v.copy() for k, v in s.chunks.items()},
                copy.deepcopy(s.strikes),
                copy.deepcopy(s.armed),
                {k: v.copy() for k, v in s.paused.items()},
                copy.deepcopy(s.levels),
            )
            for s in self.stores
        ]

    def _restore(self, snapshot) -> None:
        timers, stores = snapshot
        self.timers.clear()
        self.timers.update(timers)
        for store, (seq, token, deltas, buckets, chunks, strikes, armed, paused, levels) in zip(self.stores, stores):
            store.seq, store.token, store.deltas = seq, token, deltas
            store.buckets, store.chunks, store.strikes, store.armed = buckets, chunks, strikes, armed
            store.paused, store.levels = paused, levels

    def batch(self, now, requests):
        move = self.plan[self.turn % len(self.plan)]
        self.turn += 1
        if move == "restart":
            self.caches = [[IndexCache(), IndexCache()] for _ in self.stores]
            self._use_worker(0)
        if move.startswith("abort"):
            snapshot, held = self._snapshot(), dict(self.held)
            # An attempt whose state is thrown away; its caches moved on. Spark re-runs a batch with the same
            # input, but nothing may rest on the attempt having done the same: this one misses a request.
            # (The driver never sees a failed attempt's output: the timed writer is as it was.)
            super().batch(now, requests[:-1])
            self._restore(snapshot)
            self.held = held
        if move.endswith("other"):
            self._use_worker(1 - self.worker)
        result = super().batch(now, requests)
        self.check_index()
        return result

    def check_index(self) -> None:
        """The index is exact: what the chunks say is pending, and what the worker's memory holds."""
        for store in self.stores:
            stored = store.index_entries()
            if store.token is None or store.token.entries >= 0:  # -1: unknown (an invalidation from a count unknown)
                assert (store.token.entries if store.token else 0) == len(stored)
            cache = store.cache
            # A cache the next call would trust must agree (a stale one is rebuilt before use).
            if (
                store.token is not None
                and index_cache.IndexSession.trusted(cache, store.token)
                and cache.version == store.token.version
            ):
                assert cache.entries == stored
            assert all(c.repairs == 0 for c in self.caches[self.stores.index(store)]), "a cache disagreed"

    def fresh(self, lookahead_ms, partitions):
        # A restart of the job: worker memory is lost.
        return WorkersEngine(lookahead_ms, partitions, self.checkpoint, self.plan)


plans = st.lists(st.sampled_from(WORKER_MOVES), min_size=1, max_size=25)
TINY_LOG = {"KEEP_VERSIONS": 1, "KEEP_CHANGES_FLOOR": 0, "DELTA_PART": 1}
# Examples per run (model_examples.py): the cache mutants' derandomized runs fail by example 267 at most ("the
# nonce is ignored"): three times that is above 300, which stays (over seeds 0-9 that mutant took 130-750
# examples, and more than 1,000 twice: a plain run catches it about every other time).
WORKER_MEMORY_EXAMPLES = 300


def check_with_workers(script, plan, monkeypatch, log_settings):
    for name, value in log_settings.items():
        monkeypatch.setattr(index_cache, name, value)
    check_script(script, lambda lookahead_ms, partitions: WorkersEngine(lookahead_ms, partitions, plan=plan))


@pytest.mark.parametrize("log_settings", [{}, TINY_LOG], ids=["delta-log", "trimmed-log"])
@settings(
    max_examples=scaled(WORKER_MEMORY_EXAMPLES),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=scripts, plan=plans)
def test_rules_match_the_reference_whatever_happens_to_worker_memory(monkeypatch, log_settings, script, plan):
    """Restarts between arbitrary batches, a task moving between workers, attempts thrown away: the
    caches catch up from the delta log (or, trimmed, rebuild from the chunks) and nothing changes."""
    check_with_workers(script, plan, monkeypatch, log_settings)


@pytest.mark.parametrize("log_settings", [{}, TINY_LOG], ids=["delta-log", "trimmed-log"])
@settings(
    max_examples=scaled(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=cron_scripts, plan=plans)
def test_cron_rules_match_the_reference_whatever_happens_to_worker_memory(monkeypatch, log_settings, script, plan):
    """The same with crons: a fire on a fresh worker that files a cron's next firing rebuilds the index from the
    chunks as the call has left them (IndexSession's overlay), paused crons are rebuilt from their map."""
    check_with_workers(script, plan, monkeypatch, log_settings)


def test_a_cache_ahead_of_the_store_is_rebuilt():
    """An attempt changed worker 0's cache, then its state was thrown away and the batch ran on worker 1
    (same version number, another nonce). Worker 0's cache must not be trusted afterwards."""
    engine = WorkersEngine(partitions=1, plan=["same", "abort, other", "other"])
    engine.batch(0, [(sid(1), Request(Action.ADD, schedule(1)))])
    engine.batch(
        1,
        [
            (sid(1), Request(Action.REPLACE, schedule(1, b"new", partition=1))),
            (sid(2), Request(Action.ADD, schedule(2))),
        ],
    )
    # The attempt (which missed the ADD) and the committed run of batch 1 both wrote version 2 of the index.
    store = engine.stores[0]
    assert engine.caches[0][0].version == store.token.version
    assert engine.caches[0][0].nonce != store.token.nonces[-1]
    rebuilds = engine.caches[0][0].rebuilds
    counts = engine.batch(
        2,
        [(sid(1), Request(Action.REPLACE, schedule(1, b"newer", partition=2))), (sid(2), Request(Action.CANCEL, None))],
    )[1]
    assert counts == Counter({Outcome.REPLACED: 1, Outcome.CANCELLED: 1})
    assert engine.caches[0][0].rebuilds == rebuilds + 1


def test_delivered_ids_leave_the_index():
    """No entry outlives its schedule: after a million-style run (here 20,000) of delivered id-carrying
    schedules, replaced, cancelled and fired in parts, the index is empty and so is the delta log's tail."""
    store = MemoryShardStore()
    n = 20_000
    apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i, due=DUE + i % 3000))) for i in range(n)], 0)
    apply_requests(
        store, [(sid(i), Request(Action.REPLACE, schedule(i, b"new", due=DUE + 5000))) for i in range(0, n, 5)], 1
    )
    apply_requests(store, [(sid(i), Request(Action.CANCEL, None)) for i in range(1, n, 20)], 2)
    assert store.token.entries == n - n // 20
    delivered = 0
    while store.armed:
        timer = min(store.armed)
        for frame in fire(store, timer, timer):
            delivered += len(frame)
    assert delivered == n - n // 20
    assert store.token.entries == 0 and store.cache.entries == {} and store.index_entries() == {}
    assert sum(store.token.sizes) <= max(index_cache.KEEP_CHANGES_FLOOR, 0) + n


def test_the_index_holds_entries_the_cyclic_garbage_collector_stops_tracking():
    """PySpark's daemon runs a full garbage collection after every task: whatever the workers' index holds it
    must not visit again and again (millions pending). Entries filed by a call, caught up from the delta log by
    another worker and rebuilt from the chunks are all exact tuples of atomic values, untracked after a
    collection; the rules still get IndexEntry views."""
    import gc

    store = MemoryShardStore()
    n = 2_000
    apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i, due=DUE + i))) for i in range(n)], 0)
    caught_up = index_cache.IndexCache()
    store.cache, filed = caught_up, store.cache
    apply_requests(store, [(sid(-1), Request(Action.ADD, schedule(-1, due=DUE + 10_000)))], 1)
    assert caught_up.rebuilds == 1  # a fresh cache: rebuilt from the chunks
    store.cache, rebuilds = filed, filed.rebuilds  # behind by one version: catches up from the delta log
    apply_requests(store, [(sid(0), Request(Action.REPLACE, schedule(0, b"new", due=DUE + 20_000)))], 2)
    assert filed.rebuilds == rebuilds
    gc.collect()
    for cache in (filed, caught_up):
        assert len(cache.entries) >= n
        assert all(type(entry) is tuple and not gc.is_tracked(entry) for entry in cache.entries.values())
    view = index_cache.IndexSession(store).get(sid(0))
    assert isinstance(view, index_cache.IndexEntry) and view.due_ms == DUE + 20_000


def test_a_herd_leaves_the_index_as_one_change_and_another_worker_catches_up():
    """A bucket retired whole (a herd, delivered) leaves the index as one range change, not a change per id;
    entries due in other buckets stay, and a worker catching up from the delta log applies the range."""
    store = MemoryShardStore()
    other = index_cache.IndexCache()
    n = 5_000
    apply_requests(
        store,
        [(sid(i), Request(Action.ADD, schedule(i))) for i in range(n)]
        + [(sid(-1), Request(Action.ADD, schedule(-1, due=DUE + 10_000)))],
        0,
    )
    store.cache, behind = other, store.cache
    apply_requests(store, [(sid(-2), Request(Action.ADD, schedule(-2, due=DUE + 20_000)))], 1)
    store.cache, rebuilds = behind, other.rebuilds  # the first worker missed a version: it catches up below
    delivered = sum(len(frame) for frame in fire(store, min(store.armed), DUE))
    assert delivered == n
    assert store.token.sizes[-1] == 1 and store.token.entries == 2
    assert set(store.cache.entries) == {sid(-1), sid(-2)} == set(store.index_entries())
    store.cache = other
    counts = apply_requests(
        store, [(sid(0), Request(Action.CANCEL, None)), (sid(-1), Request(Action.CANCEL, None))], DUE + 1
    ).outcomes
    assert counts == Counter({Outcome.CANCEL_NOOP: 1, Outcome.CANCELLED: 1})
    assert other.rebuilds == rebuilds and other.entries == store.index_entries() == {sid(-2): other.entries[sid(-2)]}


def test_an_index_delta_survives_its_blob():
    """Changes as stored in state: an entry, a removal, a range."""
    from kafka_scheduler.engine.processor.blobs import delta_blob, delta_of_blob

    changes = [(b"a", index_cache.IndexEntry(5, "t-0-1", b"d" * 20)), (b"b", None), (None, (1000, 1999))]
    assert delta_of_blob(delta_blob(changes)) == changes
    # Entries only (an ingest's delta) take the bulk path; either way entries come back as the cache stores them.
    for delta in (changes[:1] * 3, changes):
        back = delta_of_blob(delta_blob(delta))
        assert back == delta
        assert all(type(entry) is tuple for sid, entry in back if sid is not None and entry is not None)


def test_a_worker_catching_up_applies_each_part_of_the_delta_log_in_order():
    """A part of entries only goes in at once; a part with removals or a range applies its changes in order, so
    an entry filed after a range that covers it stays, and one filed before it goes."""
    entries = {b"old": (1500, "t-9-1", b"d")}
    index_cache.apply_changes(entries, [(b"a", (5, "t-0-1", b"d")), (b"b", (6, "t-1-1", b"d"))])
    assert entries == {b"old": (1500, "t-9-1", b"d"), b"a": (5, "t-0-1", b"d"), b"b": (6, "t-1-1", b"d")}
    index_cache.apply_changes(
        entries,
        [(b"c", (1600, "t-2-1", b"d")), (None, (1000, 1999)), (b"d", (1700, "t-3-1", b"d"))],
    )
    index_cache.apply_changes(entries, [(b"a", None)])
    assert entries == {b"b": (6, "t-1-1", b"d"), b"d": (1700, "t-3-1", b"d")}
    index_cache.apply_changes(entries, [(b"e", index_cache.IndexEntry(7, "t-4-1", b"d"))])
    assert type(entries[b"e"]) is tuple  # a NamedTuple from a store is kept as the plain tuple


def test_a_fire_after_a_restart_does_not_wait_for_a_rebuild_of_the_index():
    """The first overdue delivery after a restart: the fire forgets what it delivers without rebuilding
    the new worker's index from every chunk; it invalidates the index, and the next call that reads it
    rebuilds it, exactly."""
    store = MemoryShardStore()
    n = 5_000
    apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i, due=DUE + (i % 2) * 10_000))) for i in range(n)], 0)
    store.cache = index_cache.IndexCache()  # a restart: worker memory is gone
    delivered = [s for frame in fire(store, min(store.armed), DUE) for s in schedules_of(frame)]
    assert len(delivered) == n // 2
    assert store.cache.rebuilds == 0 and store.token.entries == n // 2  # counted without the index
    counts = apply_requests(
        store, [(sid(0), Request(Action.CANCEL, None)), (sid(1), Request(Action.CANCEL, None))], DUE + 1
    ).outcomes
    assert counts == Counter({Outcome.CANCEL_NOOP: 1, Outcome.CANCELLED: 1})  # 0 was delivered, 1 is pending
    assert store.cache.rebuilds == 1 and store.token.entries == n // 2 - 1
    assert store.cache.entries == store.index_entries()


def test_a_request_costs_no_state_call():
    """The index costs a constant few state calls per handler call, whatever the number of ids."""
    calls = Counter()

    class Counting(MemoryShardStore):
        def __getattribute__(self, name):
            if name.startswith(("index_token", "delta_", "bucket_", "chunk_", "strikes_", "armed_")):
                calls[name] += 1
            return super().__getattribute__(name)

    for n in (100, 10_000):
        store = Counting()
        apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i))) for i in range(n)], 0)
        calls.clear()
        apply_requests(
            store,
            [(sid(i), Request(Action.REPLACE, schedule(i, b"new"))) for i in range(n)]
            + [(sid(n + i), Request(Action.ADD, schedule(n + i))) for i in range(n)],
            1,
        )
        index_calls = sum(v for k, v in calls.items() if k.startswith(("index_token", "delta_")))
        assert index_calls <= 2 + 2 * index_cache.parts_of(2 * n), calls


# Broken cache rules the tests above must catch (each tried by hand too, see the commit message).


def _apply_no_delta(self, version, part):
    return []


def _trust_any_nonce(cache, token):
    return cache.nonce is not None and token.base <= cache.version <= token.version


class _WithoutStrikes:
    """A store whose strike lists read empty."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        return getattr(self._store, name)

    def strikes_get(self, bucket, n):
        return []


ORIGINAL_STORED_INDEX = index_cache.stored_index


def _stored_index_ignoring_strikes(store, *args, **kwargs):
    # Wraps the rule rather than copying it: a copy stopped matching its signature (the overlay) and went red with
    # a TypeError, whatever the tests checked.
    return ORIGINAL_STORED_INDEX(_WithoutStrikes(store), *args, **kwargs)


def _forget_nothing(self, delivered):
    pass


CACHE_MUTANTS = {
    "a delta is not applied": ((MemoryShardStore, "delta_get", _apply_no_delta), {}),
    "the nonce is ignored": ((index_cache.IndexSession, "trusted", staticmethod(_trust_any_nonce)), {}),
    "a rebuild ignores strikes": ((index_cache, "stored_index", _stored_index_ignoring_strikes), TINY_LOG),
    "fire leaves delivered ids in the index": ((ShardTransaction, "forget", _forget_nothing), {}),
}


@pytest.mark.parametrize("mutant", list(CACHE_MUTANTS))
def test_the_worker_memory_tests_find_each_broken_cache_rule(mutant, monkeypatch):
    (owner, name, replacement), log_settings = CACHE_MUTANTS[mutant]

    @settings(
        max_examples=WORKER_MEMORY_EXAMPLES,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(script=scripts, plan=plans)
    def model_test(script, plan):
        check_with_workers(script, plan, monkeypatch, log_settings)

    monkeypatch.setattr(owner, name, replacement)
    with pytest.raises(AssertionError):
        model_test()


def test_digests_are_stable_across_versions():
    """Digests are stored in checkpoints (chunk rows, the index): a change of encoding would make every identical
    replace of a schedule stored before it count as a replace. Pinned values, one per kind of field."""
    from kafka_scheduler.engine.rules.schedule import WriteBack

    cases = [
        (Schedule(5, "out", None, None, (), "d"), "16b62b78f55ea381054041f50b6bc733"),
        (Schedule(5, "out", b"k", b"v", (("a", b"1"), ("b", None)), "d"), "17f86c99aba126590b57a211f65cda2e"),
        (Schedule(7, "t2", b"", b"", (), "d", partition=3), "29611dfa90af736f659efc6eea9c928e"),
        (Schedule(7, "t2", b"k", b"v", (), "d", partition_key=b"pk"), "dd45dbc9f51c0724eb761f87ff0021b7"),
        (
            Schedule(
                9,
                "t",
                b"k",
                None,
                (("x", b"y"),),
                "d",
                write_back=WriteBack("wb", 2, b"wk", (("h", b"v"),)),
                history=True,
            ),
            "000a8a9bec4c4e033a7ecbc103ff35c5",
        ),
        (Schedule(9, "t", b"k", None, (), "d", history=True), "3539aa430093a31e5ca657499bcd3b0f"),
    ]
    assert [digest(s).hex() for s, _ in cases] == [expected for _, expected in cases]


def test_the_shards_of_a_herd_prepare_it_at_the_same_instant():
    """Shards holding about the same bytes due at one instant are armed at the same instant, so one batch
    prepares the whole herd (a batch writing a herd beyond --max-held holds the job until the instant)."""
    timers = []
    for shard, n in enumerate((40_000, 41_000, 43_000)):
        store = MemoryShardStore(shard)
        apply_requests(
            store,
            [(sid(i), Request(Action.ADD, schedule(i, value=b"v" * 100))) for i in range(n)],
            0,
            window_ms=3000,
            run="r",
        )
        timers.append(min(store.armed))
    lead = DUE - 3000 - timers[0]
    assert lead >= 2000 and timers == [timers[0]] * 3, (lead, timers)


def test_a_fire_on_a_fresh_worker_that_files_a_next_firing_rebuilds_the_index_as_the_call_left_the_chunks():
    """After a restart (fresh worker memory) a fire retires part of a bucket, rewriting its chunk, and files the
    next firing of a cron it held: the index, rebuilt in the middle of the call, must read the bucket as the call
    left it (its metadata is written only at the end of the call)."""
    from kafka_scheduler.engine.rules.schedule import Cron

    store = MemoryShardStore(0)
    cron_add = Request(
        Action.CRON_ADD,
        Schedule(0, "out", b"k", b"tick", (), "requests-0-1", cron=Cron("* * * * * */5")),
        activation="requests-0-1",
    )
    later = Schedule(15_700, "out", b"k", b"later", (), "requests-0-2")
    apply_requests(store, [(b"cron:requests/c", cron_add), (sid(7), Request(Action.ADD, later))], 10_200)
    store.cache = IndexCache()  # a new worker process
    timer = min(t for t, _ in store.timers)
    store.timers.clear()
    emitted = [s for frame in fire(store, timer, 15_100) for s in schedules_of(frame)]
    assert [s.delivery_id for s in emitted] == ["requests-0-1@15000"]
    assert store.index_entries() == store.cache.entries
    assert set(store.cache.entries) == {b"cron:requests/c", sid(7)}
    assert index_cache.IndexEntry._make(store.cache.entries[b"cron:requests/c"]).delivery_id == "requests-0-1@20000"
    assert store.token.entries == 2
    # The next call trusts this cache (it is the version the token lists) and agrees with a rebuild.
    assert index_cache.IndexSession.trusted(store.cache, store.token)
