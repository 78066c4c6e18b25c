"""Coarse levels of the wheel: schedules due far ahead share wide buckets, refined a level at a time as they near.

The reference model runs with tiny levels (a fan-out of 2: buckets of 2, 4, 8 and 16 s) and dues and clock steps
that reach them, so refinement, listing of dense seconds, the mark and strikes of schedules in coarse buckets come
up in most scripts; after every batch the buckets must be disjoint and the stored levels must name them. The cost
tests count state calls, never time.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.rules import buckets
from kafka_scheduler.engine.rules.batch import apply_requests, fire
from kafka_scheduler.engine.rules.buckets import BUCKET_MS, Levels, bucket_of, is_coarse, key_range
from kafka_scheduler.engine.rules.entries import entries_frame, schedules_of
from kafka_scheduler.engine.rules.index_cache import IndexCache
from kafka_scheduler.engine.rules.schedule import Action, Request, Schedule
from kafka_scheduler.engine.rules.shard import ShardTransaction
from kafka_scheduler.engine.rules.store import MemoryShardStore

from .model_examples import scaled
from .test_schedule_rules import (
    COMPLETE_TARGETS,
    EXTRAS,
    HEADERS,
    IDS,
    KEYS,
    LOOKAHEADS,
    PARTITIONS,
    TOPICS,
    TWEAK_FIELDS,
    VALUES,
    Op,
    Restart,
    check_script,
    cron_scripts,
)
from .test_wheel_layout import WorkersEngine, plans

# Dues up to ~50 s ahead (the top tiny level), and a clock that also jumps back far enough to make them further.
FAR_DUES = st.one_of(
    st.tuples(st.just("rel"), st.sampled_from([-50, 0, 700, 2999, 5000, 9000, 17_000, 40_000])),
    st.tuples(st.just("abs"), st.sampled_from([9_000, 10_999, 11_000, 20_000, 33_000, 47_999, 48_000, 60_500])),
)
FAR_OP_KINDS = [
    (
        st.builds(
            Op,
            st.sampled_from(["ADD", "REPLACE"]),
            st.sampled_from(IDS),
            FAR_DUES,
            TOPICS,
            KEYS,
            VALUES,
            HEADERS,
            extras=EXTRAS,
        ),
        4,
    ),
    (st.builds(Op, st.just("CANCEL"), st.sampled_from(IDS)), 1),
    (st.builds(Op, st.just("ADD_NO_ID"), st.just(b""), FAR_DUES, TOPICS, KEYS, VALUES, HEADERS), 2),
    (st.builds(Op, st.just("RESEND"), resend=st.integers(0, 8)), 1),
    (st.builds(Op, st.just("TWEAK"), resend=st.integers(0, 8), tweak=TWEAK_FIELDS), 1),
    (st.builds(Op, st.sampled_from(["RESEND_DONE", "CANCEL_DONE", "COMPLETE_DONE"]), resend=st.integers(0, 3)), 1),
    (st.builds(Op, st.just("COMPLETE"), st.sampled_from(IDS), target=COMPLETE_TARGETS, resend=st.integers(0, 8)), 1),
]
far_ops = st.sampled_from([kind for kind, weight in FAR_OP_KINDS for _ in range(weight)]).flatmap(lambda kind: kind)
far_steps = st.lists(
    st.tuples(
        st.lists(far_ops, max_size=6),
        st.sampled_from([-20_000, -1500, 0, 1, 500, 1000, 1000, 3000, 5000, 8000, 16_000]),
        st.one_of(st.none(), st.none(), st.builds(Restart, LOOKAHEADS, PARTITIONS)),
    ),
    min_size=1,
    max_size=30,
)
far_scripts = st.tuples(LOOKAHEADS, PARTITIONS, far_steps)


def check_layout(store: MemoryShardStore) -> None:
    """No two buckets overlap, and the stored levels (when written) name every coarse bucket and keep every
    one-second bucket they do not list before the mark."""
    ranges = sorted(key_range(key) for key in store.buckets)
    for (_, end), (start, _) in itertools.pairwise(ranges):
        assert end <= start, f"buckets overlap: {ranges}"
    if store.levels is None:
        return
    mark, coarse, listed = store.levels
    assert set(coarse) == {key for key in store.buckets if is_coarse(key)}
    for key in store.buckets:
        if not is_coarse(key) and key not in listed:
            assert key_range(key)[1] <= mark, (key, mark)
    assert all(key[0] in store.buckets for key in store.chunks), "a chunk of no bucket"


class LevelsEngine(WorkersEngine):
    def batch(self, now, requests):
        result = super().batch(now, requests)
        for store in self.stores:
            check_layout(store)
        return result

    def fresh(self, lookahead_ms, partitions):
        return LevelsEngine(lookahead_ms, partitions, self.checkpoint, self.plan)


@pytest.fixture
def tiny_levels(monkeypatch):
    monkeypatch.setattr(buckets, "LEVEL_FANOUT", 2)


def engine_with(plan):
    return lambda lookahead_ms, partitions: LevelsEngine(lookahead_ms, partitions, plan=plan)


# Examples per run (model_examples.py): the level mutants' derandomized runs fail by example 62 at most, but "a
# coarse bucket may hold a listed second" took 134 at 200 examples and 225 at 300 (below 500 the count moves
# hypothesis's sequence) and 52-447 over seeds 0-19, mean 129: three times that is about 400, which stays.
LEVEL_EXAMPLES = 400


@pytest.mark.parametrize("dense_rows", [2, 32])
@settings(
    max_examples=scaled(LEVEL_EXAMPLES),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=far_scripts)
def test_rules_match_the_reference_with_coarse_levels(tiny_levels, monkeypatch, dense_rows, script):
    monkeypatch.setattr(buckets, "DENSE_ROWS", dense_rows)
    check_script(script, engine_with(("same",)))


@settings(
    max_examples=scaled(200),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=far_scripts, plan=plans)
def test_coarse_levels_survive_restarts_moves_and_thrown_away_attempts(tiny_levels, monkeypatch, script, plan):
    monkeypatch.setattr(buckets, "DENSE_ROWS", 2)
    check_script(script, engine_with(plan))


@settings(
    max_examples=scaled(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(script=cron_scripts)
def test_cron_rules_match_the_reference_with_coarse_levels(tiny_levels, script):
    check_script(script, engine_with(("same",)))


# ---------------------------------------------------------------- costs

NOW = 1_700_000_000_000
HOUR, DAY = 3_600_000, 86_400_000


class CountingStore(MemoryShardStore):
    calls: Counter

    def __getattribute__(self, name):
        if name in STATE_CALLS:
            object.__getattribute__(self, "calls")[name] += 1
        return object.__getattribute__(self, name)


STATE_CALLS = {name for name in dir(MemoryShardStore) if not name.startswith("_")} - {"index_entries"}


def ingest(dues, shards: int = 4, now: int = NOW, stores=None, timers=None, first: int = 0):
    """One batch of ADDs with ids, due at ``dues``, spread over the shards; the stores, and the state calls made."""
    timers = set() if timers is None else timers
    if stores is None:
        stores = [CountingStore(shard, timers) for shard in range(shards)]
        for store in stores:
            store.calls = Counter()
    schedules = [
        Schedule(int(d), "out", f"k{i}".encode(), b"x" * 100, (), f"in-0-{i}") for i, d in enumerate(dues, first)
    ]
    ids = [f"id:in/{i}".encode() for i in range(first, first + len(dues))]
    for shard, store in enumerate(stores):
        mine = [i for i in range(len(ids)) if hash(ids[i]) % len(stores) == shard]
        keyed = entries_frame([schedules[i] for i in mine], [(ids[i], None) for i in mine]).assign(
            action=Action.ADD.value, src_topic="in"
        )
        apply_requests(store, [], now, None, 3000, "run", keyed)
    return stores, sum((s.calls for s in stores), Counter())


def test_spread_dues_cost_about_the_state_calls_of_clustered_ones():
    """80,000 ADDs in one batch over the job's 4 shards: due one a second over a month (a bucket each, without
    levels: ~6 state calls and a blob per request) or a millisecond apart (~1,000 a bucket)."""
    rng = np.random.default_rng(7)
    n = 80_000
    spread = NOW + HOUR + rng.integers(0, 30 * DAY - HOUR, n)
    clustered = NOW + HOUR + np.arange(n)
    _, spread_calls = ingest(spread)
    _, clustered_calls = ingest(clustered)
    assert sum(spread_calls.values()) <= 2 * sum(clustered_calls.values()), (spread_calls, clustered_calls)
    assert sum(spread_calls.values()) <= 0.05 * n
    # And it does not grow with the batch: the buckets of a month are a few hundred whatever the batch holds.
    _, quarter_calls = ingest(spread[: n // 4])
    assert spread_calls["chunk_put"] <= 1.5 * quarter_calls["chunk_put"]


def run_until_empty(stores, timers, lookahead: int, emitted: dict) -> None:
    """The clock driven from timer to timer: every emitted row checked on time (within the lookahead before its due
    time) and emitted once."""
    while timers:
        now = min(t for t, _ in timers)
        for timer in sorted(t for t in timers if t[0] <= now):
            timers.discard(timer)
            for frame in fire(stores[timer[1]], timer[0], now, lookahead, "run"):
                for delivery_id, due in zip(frame["delivery_id"], frame["due_ms"]):
                    assert delivery_id not in emitted, f"{delivery_id} emitted twice"
                    assert due - lookahead <= now <= due, (delivery_id, due, now)
                    emitted[delivery_id] = now


def lifetime(dues, lookahead: int) -> tuple[dict, int]:
    timers: set = set()
    stores, _ = ingest(dues, shards=2, timers=timers)
    emitted: dict = {}
    run_until_empty(stores, timers, lookahead, emitted)
    assert all(not s.buckets and not s.chunks and not s.strikes for s in stores)
    return emitted, sum(sum(s.calls.values()) for s in stores)


def test_spread_dues_are_delivered_on_time_each_once(monkeypatch):
    """A month of sparse dues with the default levels: every schedule is prepared within the lookahead before its
    due time (none late, none early), once. Refinement adds state calls over a schedule's life (at this sparseness
    each one passes through every level alone: ~2x the one-second layout's ~27), spread over the month."""
    rng = np.random.default_rng(3)
    n = 600
    dues = np.sort(NOW + HOUR + rng.integers(0, 30 * DAY - HOUR, n))
    dues[:5] = NOW + 70 * 60_000 + np.arange(5) * 1000  # a few due within the first coarse buckets' reach
    emitted, calls = lifetime(dues, 3000)
    assert len(emitted) == n
    monkeypatch.setattr(buckets, "COARSE_LEVELS", 0)
    _, one_second_calls = lifetime(dues, 3000)
    assert calls <= 2.5 * one_second_calls, (calls, one_second_calls)


def test_a_herd_far_ahead_is_a_bucket_of_its_own_and_never_rewritten():
    """A dense second is filed as its own bucket even a month ahead: it does not pass through the levels (each
    would read and rewrite all of it)."""
    herd = np.full(5_000, NOW + 20 * DAY)
    stores, calls = ingest(herd, shards=1)
    [store] = stores
    assert list(store.buckets) == [bucket_of(NOW + 20 * DAY)]
    assert calls["chunk_put"] == 1
    # Sparse schedules next to it: in its second, with it; within its level-1 bucket, one-second ones (no coarse
    # bucket may hold the herd's); further, coarse.
    ingest([NOW + 20 * DAY + 100, NOW + 20 * DAY + 5000, NOW + 25 * DAY], stores=stores, first=5_000)
    keys = set(store.buckets)
    assert bucket_of(NOW + 20 * DAY + 5000) in keys and len(keys) == 3
    assert sum(is_coarse(k) for k in keys) == 1
    check_layout(store)
    # Its one fire later reads each chunk once.
    chunks = sum(len(info.chunks) for key, info in store.buckets.items() if key == bucket_of(NOW + 20 * DAY))
    store.calls.clear()
    timer = store.buckets[bucket_of(NOW + 20 * DAY)].timer_ms
    out = sum(len(f) for f in fire(store, timer, NOW + 20 * DAY, 3000, "run"))
    assert out == 5_001 and store.calls["chunk_get"] == chunks


def test_a_checkpoint_written_without_levels_is_read_and_refined_as_it_goes(monkeypatch):
    """State from the one-second layout (no ``levels`` value): the levels are rebuilt from the bucket keys, with the
    mark past every one-second bucket, so replaces and cancels still find their schedules and new far dues beyond
    them go coarse."""
    monkeypatch.setattr(buckets, "COARSE_LEVELS", 0)
    rng = np.random.default_rng(5)
    old = NOW + HOUR + rng.integers(0, 10 * DAY, 200)
    timers: set = set()
    [store], _ = ingest(old, shards=1, timers=timers)
    assert store.levels is None and not any(is_coarse(k) for k in store.buckets)
    monkeypatch.setattr(buckets, "COARSE_LEVELS", 4)
    ids = [f"id:in/{i}".encode() for i in range(200)]
    moved = Schedule(int(NOW + 20 * DAY), "out", b"k0", b"new", (), "in-1-0")
    requests = [(ids[0], Request(Action.REPLACE, moved)), (ids[1], Request(Action.CANCEL, None))]
    counts = apply_requests(store, requests, NOW + 1, None, 3000, "run").outcomes
    assert sum(counts.values()) == 2
    assert store.levels[0] >= max(old) and any(is_coarse(k) for k in store.buckets)
    check_layout(store)
    assert set(store.index_entries()) == set(ids) - {ids[1]}
    emitted: dict = {}
    run_until_empty([store], timers, 3000, emitted)
    assert sorted(emitted) == sorted([f"in-0-{i}" for i in range(2, 200)] + ["in-1-0"])


# ---------------------------------------------------------------- broken level rules the tests above must catch


def _locate_the_second(self, due_ms):
    return due_ms // BUCKET_MS


def _refine_ignoring_strikes(original):
    def refine(self, bucket, info):
        self.struck.pop(bucket, None)
        info = info.copy()
        info.strikes = []
        return original(self, bucket, info)

    return refine


def _no_mark(self, mark_ms):
    pass


def _coarse_ignoring_what_it_would_hold(self, level):
    return set()


LEVEL_MUTANTS = {
    "a schedule in a coarse bucket is looked for in its second": (Levels, "locate", _locate_the_second),
    "refinement ignores strikes": (ShardTransaction, "refine", _refine_ignoring_strikes(ShardTransaction.refine)),
    "the mark never rises": (Levels, "raise_mark", _no_mark),
    "a coarse bucket may hold a listed second": (Levels, "_held", _coarse_ignoring_what_it_would_hold),
}


@pytest.mark.parametrize("mutant", list(LEVEL_MUTANTS))
def test_the_level_tests_find_each_broken_rule(mutant, monkeypatch, tiny_levels):
    owner, name, replacement = LEVEL_MUTANTS[mutant]
    monkeypatch.setattr(buckets, "DENSE_ROWS", 2)

    @settings(
        max_examples=LEVEL_EXAMPLES,
        phases=[Phase.generate],
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(script=far_scripts)
    def model_test(script):
        check_script(script, engine_with(("same",)))

    monkeypatch.setattr(owner, name, replacement)
    with pytest.raises(AssertionError):
        model_test()


# ---------------------------------------------------------------- the processor's store


class FakeValue:
    def __init__(self):
        self.value = None

    def get(self):
        return self.value

    def update(self, value):
        self.value = tuple(value)


class FakeMap:
    def __init__(self):
        self.values = {}

    def getValue(self, key):
        return self.values.get(tuple(key))

    def updateValue(self, key, value):
        self.values[tuple(key)] = tuple(value)

    def removeKey(self, key):
        self.values.pop(tuple(key), None)

    def iterator(self):
        return iter(list(self.values.items()))

    def keys(self):
        return iter(list(self.values))


class FakeHandle:
    def __init__(self):
        self.timers = set()

    def getValueState(self, name, schema):
        return FakeValue()

    def getMapState(self, name, key_schema, value_schema):
        return FakeMap()

    def registerTimer(self, timer_ms):
        self.timers.add(timer_ms)


def test_the_processor_state_keeps_the_levels_and_coarse_chunks():
    """The Spark side (``MapStateShardStore``) over fake state variables: coarse keys and the levels survive the
    value shapes and Arrow blobs, and a month of spread dues comes out on time from timer to timer."""
    from kafka_scheduler.engine.processor.state_store import MapStateShardStore
    from kafka_scheduler.engine.processor.wheel_processor import WheelProcessor

    processor = WheelProcessor(window_ms=3000, run="run")
    processor.init(FakeHandle())
    store = MapStateShardStore(processor)
    store.use_shard(0)
    store.cache = IndexCache()  # not the worker's module-level cache: other tests use shard 0
    rng = np.random.default_rng(11)
    dues = NOW + HOUR + rng.integers(0, 30 * DAY - HOUR, 100)
    keyed = entries_frame(
        [Schedule(int(d), "out", b"k", b"v", (), f"in-0-{i}") for i, d in enumerate(dues)],
        [(f"id:in/{i}".encode(), None) for i in range(len(dues))],
    ).assign(action=Action.ADD.value, src_topic="in")
    apply_requests(store, [], NOW, None, 3000, "run", keyed)
    _mark, coarse, _listed = store.levels_get()
    assert coarse and all(is_coarse(k) for k in coarse) and set(coarse) == set(store.bucket_keys())
    cancel = [(b"id:in/0", Request(Action.CANCEL, None))]
    assert sum(apply_requests(store, cancel, NOW + 1, None, 3000, "run").outcomes.values()) == 1
    emitted: dict = {}
    timers = {(t, 0) for t in processor.handle.timers}
    while timers:
        now = min(t for t, _ in timers)
        timers.discard((now, 0))
        processor.handle.timers.clear()
        for frame in fire(store, now, now, 3000, "run"):
            for delivery_id, due in zip(frame["delivery_id"], frame["due_ms"]):
                assert delivery_id not in emitted and due - 3000 <= now <= due
                emitted[delivery_id] = now
        timers |= {(t, 0) for t in processor.handle.timers}
    assert sorted(emitted) == sorted(f"in-0-{i}" for i in range(1, len(dues)))
    assert not list(store.bucket_keys()) and not processor.chunks.values


def test_a_chunk_survives_its_blob():
    """Chunks are written column by column (``to_blob``): every field comes back as written, nullable ints as
    nullable ints, whatever the frame held (None, NaN, headers as tuples or as the dicts Arrow hands back)."""
    from kafka_scheduler.engine.processor.blobs import from_blob, to_blob
    from kafka_scheduler.engine.rules.schedule import Cron, WriteBack

    schedules = [
        Schedule(
            1000 + i,
            "out",
            None if i % 5 == 0 else b"k%d" % i,
            None if i % 7 == 0 else b"v" * i,
            (("h", b"1"), ("n", None)) if i % 2 else (),
            f"t-0-{i}",
            partition=(i % 3) if i % 4 == 0 else None,
            partition_key=b"pk" if i % 6 == 0 else None,
            write_back=WriteBack("wb", 2, b"wk", (("a", b"b"),)) if i % 8 == 0 else None,
            history=i % 9 == 0,
            max_lateness_ms=500 if i % 10 == 0 else None,
            cron=Cron("* * * * * */5", "Europe/Paris" if i % 2 else None, "skip", 5 if i % 3 else None, None)
            if i % 11 == 0
            else None,
        )
        for i in range(60)
    ]
    ids = [(b"id:%d" % i, b"d" * 16) if i % 3 else (None, None) for i in range(60)]
    frame = entries_frame(schedules, ids)
    floats = frame.assign(partition=frame["partition"].astype(float))
    for written in (frame, from_blob(to_blob(frame)), floats, frame[frame["cron_expr"].isna()]):
        back = from_blob(to_blob(written))
        assert schedules_of(back) == schedules_of(written)
        assert [
            (None if s is None else bytes(s), None if d is None else bytes(d))
            for s, d in zip(back["sid"], back["digest"])
        ] == [(s, d) for s, d in zip(written["sid"], written["digest"])]
        assert str(back["partition"].dtype) == "Int32" and str(back["max_lateness_ms"].dtype) == "Int64"
