"""The scheduling rules (schedule.py) against a tiny reference model, without Spark.

``Engine`` plays the part of Spark's transformWithState: per micro-batch it hands each
id's requests, in log order, to ``apply_request`` at the batch time, then fires every
timer at or before the batch time through ``fire``. The reference model is the protocol
written as plainly as possible: latest request per id wins; at the end of each batch
everything pending and due is delivered.
"""

from __future__ import annotations

import copy
import zlib
from dataclasses import dataclass
from typing import Optional

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler import wheel
from kafka_scheduler.schedule import Action, MemoryStore, Outcome, Request, Schedule, fire, process_requests
from kafka_scheduler.state_processor import in_log_order


def sched(due: int, value: bytes = b"v", version: str = "t-0-0", topic: str = "out") -> Schedule:
    return Schedule(due_ms=due, topic=topic, key=b"k", value=value, headers=(("h", b"1"),), delivery_id=version)


class Engine:
    """In-memory stand-in for the Spark operator: state per id plus armed timers.

    Like transformWithState, a batch hands each id its requests at once (in log order),
    then fires the timers that are due.
    """

    def __init__(self) -> None:
        self.pending: dict[str, Schedule] = {}
        self.timers: set[tuple[int, str]] = set()
        self.outcomes: list[Outcome] = []

    def batch(self, now: int, requests: list[tuple[str, Request]]) -> list[Schedule]:
        by_id: dict[str, list[Request]] = {}
        for sid, request in requests:
            by_id.setdefault(sid, []).append(request)
        delivered = []
        for sid, of_id in by_id.items():
            outcomes, due_now = process_requests(MemoryStore(self.pending, self.timers, sid), of_id, now)
            self.outcomes.extend(outcomes)
            if due_now is not None:
                delivered.append(due_now)
        for timer in sorted(t for t in self.timers if t[0] <= now):
            self.timers.discard(timer)
            fired = fire(MemoryStore(self.pending, self.timers, timer[1]), timer[0])
            if fired is not None:
                delivered.append(fired)
        return delivered

    def restart(self) -> "Engine":
        """What survives a restart: the stored state and timers (the checkpoint), nothing else."""
        fresh = Engine()
        fresh.pending, fresh.timers = copy.deepcopy(self.pending), set(self.timers)
        return fresh


class WheelEngine:
    """The bulk layout (wheel.py) driven the same way: shards, buckets, index, timers per bucket."""

    SHARDS = 3

    def __init__(self) -> None:
        self.timers: set[tuple[int, int]] = set()
        self.stores = [wheel.MemoryShardStore(shard, self.timers) for shard in range(self.SHARDS)]
        self.outcomes: list[Outcome] = []

    def shard_of(self, sid: str) -> int:
        return zlib.crc32(sid.encode()) % self.SHARDS

    def batch(self, now: int, requests: list[tuple[str, Request]]) -> list[Schedule]:
        per_shard: dict[int, list] = {}
        anonymous: dict[int, list] = {}
        for sid, request in requests:
            if sid.startswith(wheel.INTERNAL_SID_PREFIX):  # as the processor does: filed in bulk
                anonymous.setdefault(self.shard_of(sid), []).append(request.schedule)
            else:
                per_shard.setdefault(self.shard_of(sid), []).append((sid, request))
        delivered = []
        for shard in sorted(set(per_shard) | set(anonymous)):
            counts, due_now, anonymous_due = wheel.apply_requests(
                self.stores[shard], per_shard.get(shard, []), now, wheel.entries_frame(anonymous.get(shard, [])))
            self.outcomes.extend(sorted(counts.elements()))
            delivered.extend(due_now)
            delivered.extend(wheel.schedules_of(anonymous_due))
        for timer in sorted(t for t in self.timers if t[0] <= now):
            self.timers.discard(timer)
            delivered.extend(wheel.schedules_of(wheel.fire(self.stores[timer[1]], timer[0], now)))
        return delivered

    def restart(self) -> "WheelEngine":
        fresh = WheelEngine()
        fresh.timers.update(self.timers)
        for old, new in zip(self.stores, fresh.stores):
            new.index = copy.deepcopy(old.index)
            new.buckets = {b: wheel.BucketInfo(i.chunks, i.fired_up_to, set(i.struck)) for b, i in old.buckets.items()}
            new.chunks = {k: v.copy() for k, v in old.chunks.items()}
        return fresh


ENGINES = [Engine, WheelEngine]


# ---------------------------------------------------------------- examples


def test_add_then_fire_at_due_time_not_before():
    engine = Engine()
    assert engine.batch(0, [("a", Request(Action.ADD, sched(100)))]) == []
    assert engine.batch(99, []) == []
    assert engine.batch(100, []) == [sched(100)]
    assert engine.batch(200, []) == []
    assert engine.pending == {} and engine.timers == set()


def test_due_in_the_past_is_delivered_in_the_same_batch():
    engine = Engine()
    assert engine.batch(50, [("a", Request(Action.ADD, sched(10)))]) == [sched(10)]
    assert engine.outcomes == [Outcome.SCHEDULED]
    assert engine.pending == {} and engine.timers == set()


def test_within_a_batch_requests_act_before_delivery():
    engine = Engine()
    due_now = Request(Action.ADD, sched(10))
    assert engine.batch(50, [("a", due_now), ("a", Request(Action.CANCEL, None))]) == []
    assert engine.batch(60, [("b", due_now), ("b", due_now)]) == [sched(10)]
    assert engine.outcomes == [Outcome.SCHEDULED, Outcome.CANCELLED, Outcome.SCHEDULED, Outcome.REPLACE_NOOP]


def test_replace_moves_the_schedule_and_the_old_version_never_fires():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100, b"old", "t-0-0")))])
    engine.batch(1, [("a", Request(Action.REPLACE, sched(300, b"new", "t-0-1")))])
    assert engine.batch(100, []) == []
    assert engine.batch(300, []) == [sched(300, b"new", "t-0-1")]
    assert engine.outcomes == [Outcome.SCHEDULED, Outcome.REPLACED]


def test_replace_with_a_past_time_delivers_now_and_old_never_fires():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100, b"old", "t-0-0")))])
    assert engine.batch(10, [("a", Request(Action.REPLACE, sched(5, b"new", "t-0-1")))]) == [sched(5, b"new", "t-0-1")]
    assert engine.batch(1000, []) == []
    assert engine.outcomes == [Outcome.SCHEDULED, Outcome.REPLACED]


def test_identical_replace_is_a_noop_that_keeps_the_first_version():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100, b"x", "t-0-0")))])
    engine.batch(1, [("a", Request(Action.REPLACE, sched(100, b"x", "t-0-7")))])
    assert engine.outcomes == [Outcome.SCHEDULED, Outcome.REPLACE_NOOP]
    assert engine.batch(100, []) == [sched(100, b"x", "t-0-0")]


def test_replace_that_differs_only_in_headers_is_not_a_noop():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100)))])
    other = Schedule(100, "out", b"k", b"v", (("h", b"2"),), "t-0-1")
    engine.batch(1, [("a", Request(Action.REPLACE, other))])
    assert engine.outcomes[-1] is Outcome.REPLACED
    assert engine.batch(100, []) == [other]


def test_add_with_a_pending_id_behaves_as_replace():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100, b"1", "t-0-0")))])
    engine.batch(1, [("a", Request(Action.ADD, sched(200, b"2", "t-0-1")))])
    assert engine.batch(150, []) == []
    assert engine.batch(200, []) == [sched(200, b"2", "t-0-1")]


def test_cancel_pending_and_unknown():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(100)))])
    engine.batch(1, [("a", Request(Action.CANCEL, None)), ("b", Request(Action.CANCEL, None))])
    assert engine.outcomes == [Outcome.SCHEDULED, Outcome.CANCELLED, Outcome.CANCEL_NOOP]
    assert engine.batch(100, []) == []
    assert engine.timers == set()


def test_cancel_after_delivery_is_a_noop():
    engine = Engine()
    engine.batch(0, [("a", Request(Action.ADD, sched(10)))])
    assert engine.batch(10, []) == [sched(10)]
    engine.batch(11, [("a", Request(Action.CANCEL, None))])
    assert engine.outcomes[-1] is Outcome.CANCEL_NOOP


def test_stale_timer_of_a_replaced_version_does_not_fire_the_new_one_early():
    pending, timers = {}, set()
    store = MemoryStore(pending, timers, "a")
    process_requests(store, [Request(Action.ADD, sched(100))], 0)
    process_requests(store, [Request(Action.REPLACE, sched(300, b"new"))], 1)
    assert timers == {(300, "a")}
    assert fire(store, 100) is None  # a timer at the old due time, had it survived, delivers nothing
    assert pending["a"].due_ms == 300


def test_in_log_order_keeps_offsets_within_a_partition_and_merges_partitions_by_timestamp():
    rows = [
        {"src_topic": "t", "src_partition": 0, "src_offset": 5, "src_ts_ms": 50},
        {"src_topic": "t", "src_partition": 1, "src_offset": 1, "src_ts_ms": 20},
        {"src_topic": "t", "src_partition": 0, "src_offset": 4, "src_ts_ms": 60},  # clock skew: offset wins
        {"src_topic": "t", "src_partition": 1, "src_offset": 2, "src_ts_ms": 70},
    ]
    ordered = [(r["src_partition"], r["src_offset"]) for r in in_log_order(rows)]
    assert ordered.index((0, 4)) < ordered.index((0, 5))
    assert ordered.index((1, 1)) < ordered.index((1, 2))
    assert ordered[0] == (1, 1) and ordered[-1] == (1, 2)


# ---------------------------------------------------------------- property: rules == reference model

IDS = ["a", "b", "c", "d", "e", "f"]


@dataclass(frozen=True)
class Op:
    kind: str  # ADD | REPLACE | CANCEL | ADD_NO_ID
    sid: Optional[str] = None
    due_offset: int = 0  # relative to the batch time: negative = already due
    value: bytes = b""


requests = st.one_of(
    st.builds(Op, st.sampled_from(["ADD", "REPLACE"]), st.sampled_from(IDS), st.integers(-50, 3000),
              st.sampled_from([b"", b"x", b"y", b"\x00\xff"])),
    st.builds(Op, st.just("CANCEL"), st.sampled_from(IDS)),
    st.builds(Op, st.just("ADD_NO_ID"), st.none(), st.integers(-50, 3000), st.sampled_from([b"x", b"y"])),
)
# A step: a batch of requests, how far the clock advances after it (including big jumps), and maybe a restart.
steps = st.lists(
    st.tuples(st.lists(requests, max_size=6), st.sampled_from([0, 1, 7, 50, 100, 333, 999, 1000, 5000]), st.booleans()),
    min_size=1, max_size=25)


def reference_run(script) -> list[list[tuple]]:
    """The protocol, plainly: per batch, apply requests in order, then deliver all that is pending and due."""
    pending: dict[str, tuple] = {}
    now, offset, out = 0, 0, []
    for batch, advance, _restart in script:
        delivered = []
        for op in batch:
            offset += 1
            version = f"t-0-{offset}"
            if op.kind == "CANCEL":
                pending.pop(op.sid, None)
                continue
            sid = op.sid if op.kind != "ADD_NO_ID" else f"offset:{offset}"
            due = now + op.due_offset
            if sid in pending and pending[sid][:2] == (due, op.value):
                continue  # identical: no-op, the pending version stays
            pending[sid] = (due, op.value, version)
        for sid in sorted(pending):
            if pending[sid][0] <= now:
                delivered.append(pending.pop(sid))
        out.append(sorted(delivered))
        now += advance
    return out


def engine_run(script, engine_class=Engine) -> list[list[tuple]]:
    engine = engine_class()
    now, offset, out = 0, 0, []
    for batch, advance, restart in script:
        requests_of_batch = []
        for op in batch:
            offset += 1
            version = f"t-0-{offset}"
            if op.kind == "CANCEL":
                requests_of_batch.append((op.sid, Request(Action.CANCEL, None)))
                continue
            sid = op.sid if op.kind != "ADD_NO_ID" else f"offset:{offset}"
            action = Action.REPLACE if op.kind == "REPLACE" else Action.ADD
            requests_of_batch.append((sid, Request(action, sched(now + op.due_offset, op.value, version))))
        delivered = engine.batch(now, requests_of_batch)
        for schedule in delivered:
            assert schedule.due_ms <= now, "delivered before its due time"
        out.append(sorted((s.due_ms, s.value, s.delivery_id) for s in delivered))
        if restart:
            engine = engine.restart()
        now += advance
    return out


@pytest.mark.parametrize("engine_class", ENGINES, ids=["per-id", "wheel"])
@settings(max_examples=400, deadline=None)
@given(script=steps)
def test_rules_match_the_reference_model(engine_class, script):
    assert engine_run(script, engine_class) == reference_run(script)


@pytest.mark.parametrize("engine_class", ENGINES, ids=["per-id", "wheel"])
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), cancelled=st.integers(0, 50))
def test_herd_all_due_at_one_instant_is_delivered_in_one_batch_exactly_once(engine_class, n, cancelled):
    engine = engine_class()
    adds = [(f"id{i}", Request(Action.ADD, sched(1000, b"h", f"t-0-{i}"))) for i in range(n)]
    engine.batch(0, adds)
    cancels = [(f"id{i}", Request(Action.CANCEL, None)) for i in range(min(cancelled, n))]
    engine.batch(1, cancels)
    assert engine.batch(999, []) == []
    delivered = engine.batch(1000, [])
    assert sorted(s.delivery_id for s in delivered) == sorted(f"t-0-{i}" for i in range(min(cancelled, n), n))
    assert engine.batch(5000, []) == []
