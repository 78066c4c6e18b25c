"""The wheel layout's costs are bounded by what a batch does, not by what a bucket holds.

Counted with an instrumented in-memory store (state values and the ids or bytes they carry),
never timed. Each bound is one the old layout broke: it kept every struck id of a bucket in
one value rewritten by every batch that struck, and added a chunk per batch without limit.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from kafka_scheduler import wheel
from kafka_scheduler.schedule import Action, Request, Schedule

from .test_schedule_rules import WheelEngine, check_script, scripts

DUE = 3_600_000  # one bucket, far ahead


class CountingStore(wheel.MemoryShardStore):
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
    wheel.apply_requests(store, [(sid(i), Request(Action.ADD, schedule(i))) for i in range(pending)], 0)
    moved_per_batch = []
    for b in range(batches):
        before = store.strike_ids_moved
        requests = []
        for i in range(b * per_batch, (b + 1) * per_batch):
            requests.append((sid(i), Request(Action.CANCEL, None) if i % 2 else
                             Request(Action.REPLACE, schedule(i, b"new", due=DUE + 1, partition=1))))
        counts = wheel.apply_requests(store, requests, 1 + b).outcomes
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
    delivered = [s for frame in wheel.fire(store, min(store.armed), DUE + 1) for s in wheel.schedules_of(frame)]
    assert Counter(s.value for s in delivered) == Counter({b"new": strikes // 2, b"v": pending - strikes})
    cancelled = {f"k{i}".encode() for i in range(1, strikes, 2)}
    assert not [s for s in delivered if s.key in cancelled]


def test_a_bucket_filled_by_many_batches_keeps_few_bounded_chunks(monkeypatch):
    monkeypatch.setattr(wheel, "SEAL_BYTES", 4096)
    store = CountingStore()
    total = 0
    for b in range(2_000):
        frame = wheel.entries_frame([schedule(b * 3 + j, b"x" * (5 + b % 40)) for j in range(3)])
        total += int(frame["entry_bytes"].sum())
        wheel.apply_requests(store, [], b, frame)
    [info] = store.buckets.values()
    sealed = [c for c in info.chunks if c[1] >= wheel.SEAL_BYTES // 2]
    unsealed = [c for c in info.chunks if c[1] < wheel.SEAL_BYTES // 2]
    assert len(sealed) <= total / (wheel.SEAL_BYTES // 2)
    assert len(unsealed) <= math.log2(wheel.SEAL_BYTES) + 1
    assert all(size < 2 * wheel.SEAL_BYTES for _, size in info.chunks)
    assert sum(size for _, size in info.chunks) == total
    assert set(store.chunks) == {(wheel.bucket_of(DUE), n) for n, _ in info.chunks}, "a merged chunk was left behind"

    # The fire makes a few state calls per chunk and hands deliveries out a chunk at a time.
    store.calls.clear()
    frames = list(wheel.fire(store, min(store.armed), DUE))
    assert sum(len(f) for f in frames) == 6_000
    assert all(int(f["entry_bytes"].sum()) < 2 * wheel.SEAL_BYTES for f in frames)
    assert store.calls["chunk_get"] == len(info.chunks)
    assert store.buckets == {} and store.chunks == {}


def test_a_partial_fire_writes_what_is_left_in_bounded_chunks(monkeypatch):
    monkeypatch.setattr(wheel, "SEAL_BYTES", 2048)
    store = wheel.MemoryShardStore()
    schedules = [schedule(i, b"y" * 40, due=DUE + i % 1000) for i in range(3_000)]
    wheel.apply_requests(store, [], 0, wheel.entries_frame(schedules))
    due = [s for f in wheel.fire(store, min(store.armed), DUE + 499) for s in wheel.schedules_of(f)]
    assert len(due) == 1_500 and all(s.due_ms <= DUE + 499 for s in due)
    [info] = store.buckets.values()
    assert all(size < 2 * wheel.SEAL_BYTES for _, size in info.chunks)
    assert sum(len(store.chunks[(wheel.bucket_of(DUE), n)]) for n, _ in info.chunks) == 1_500
    assert [t for t in store.armed] == [DUE + 500]


@pytest.mark.parametrize("values", [[10, 5000, 10], [5000], [300] * 20, [1] * 200, [2000, 2000, 1]])
def test_a_slice_goes_over_the_limit_by_at_most_its_last_row(values):
    frame = wheel.entries_frame([schedule(i, b"z" * size) for i, size in enumerate(values)])
    pieces = wheel.split_by_bytes(frame, 1024)
    assert [k for p in pieces for k in p["key"]] == list(frame["key"])  # all rows, in order
    for piece in pieces:
        sizes = list(piece["entry_bytes"])
        assert sum(sizes[:-1]) < 1024


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(script=scripts)
def test_rules_still_match_the_reference_with_tiny_chunks_and_strike_lists(monkeypatch, script):
    """Splitting, sealing and merging at every turn changes nothing the protocol can see."""
    monkeypatch.setattr(wheel, "SEAL_BYTES", 160)
    monkeypatch.setattr(wheel, "SEAL_STRIKES", 4)
    check_script(script, WheelEngine)
