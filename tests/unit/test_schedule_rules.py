"""Both state layouts against a reference model of the protocol, without Spark.

``Engine`` (per-id layout, schedule.py) and ``WheelEngine`` (wheel layout, wheel.py) play
the part of Spark's transformWithState: per micro-batch they hand each grouping key its
requests at once, in log order, at the batch time, then fire every timer at or before the
batch time. A restart keeps only what a checkpoint keeps (state and timers) and may change
the lookahead and the partitions, as a user restarting with other flags would.

The reference is the protocol written plainly: latest request per id wins; after a batch's
requests acted, a pending version is delivered once its due time is reached. With a
lookahead L, "reached" means due <= batch time + L. When L changes between runs, a version
may go out anywhere between the two rules (timers already set keep the old one); the
reference accepts exactly that window and nothing else, so with a fixed lookahead it
demands the one right batch. Outcome counts are compared per batch, and every delivery is
compared in full (due time, destination, key, value, headers, delivery id).
"""

from __future__ import annotations

import copy
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_scheduler import wheel
from kafka_scheduler.checkpoint import settle_state_settings
from kafka_scheduler.config import Config
from kafka_scheduler.schedule import Action, MemoryStore, Outcome, Request, Schedule, fire, process_requests
from kafka_scheduler.state_processor import in_log_order
from kafka_scheduler.wheel_processor import log_order


def sched(due: int, value: Optional[bytes] = b"v", version: str = "t-0-0", topic: str = "out",
          key: Optional[bytes] = b"k", headers=(("h", b"1"),)) -> Schedule:
    return Schedule(due_ms=due, topic=topic, key=key, value=value, headers=tuple(headers), delivery_id=version)


def sid(name: str | bytes) -> bytes:
    return b"id:requests/" + (name.encode() if isinstance(name, str) else name)


def anon(offset: int) -> bytes:
    return f"offset:requests/0/{offset}".encode()


class Engine:
    """The per-id layout: state per id plus armed timers (set ``lookahead_ms`` before the due time)."""

    def __init__(self, lookahead_ms: int = 0, partitions: int = 2) -> None:
        self.lookahead_ms = lookahead_ms
        self.pending: dict[bytes, Schedule] = {}
        self.timers: set[tuple[int, bytes]] = set()

    def store(self, key: bytes) -> MemoryStore:
        return MemoryStore(self.pending, self.timers, key, self.lookahead_ms)

    def batch(self, now: int, requests: list[tuple[bytes, Request]]) -> tuple[list[Schedule], Counter]:
        by_id: dict[bytes, list[Request]] = {}
        for key, request in requests:
            by_id.setdefault(key, []).append(request)
        delivered, counts = [], Counter()
        for key, of_id in by_id.items():
            outcomes, due_now = process_requests(self.store(key), of_id, now + self.lookahead_ms)
            counts.update(outcomes)
            if due_now is not None:
                delivered.append(due_now)
        for timer in sorted(t for t in self.timers if t[0] <= now):
            self.timers.discard(timer)
            fired = fire(self.store(timer[1]), now + self.lookahead_ms)
            if fired is not None:
                delivered.append(fired)
        return delivered, counts

    def restart(self, lookahead_ms: int, partitions: int) -> "Engine":
        """What survives a restart: the stored state and timers (the checkpoint), nothing else."""
        fresh = Engine(lookahead_ms)
        fresh.pending, fresh.timers = copy.deepcopy(self.pending), set(self.timers)
        return fresh


class MemoryCheckpointFiles:
    """``checkpoint.CheckpointFiles`` in memory: the settings file a checkpoint keeps."""

    where = "memory"

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.committed = False

    def has_commit(self):
        return self.committed

    def read(self, name):
        return self.files.get(name)

    def write(self, name, data):
        self.files[name] = data


class WheelEngine:
    """The wheel layout driven the same way: shards, buckets, index, timers per bucket.

    The shard count is settled as the job settles it (``checkpoint.settle_state_settings``): the
    first run records it, a restart with other partitions keeps it. The first run here asks for
    one shard per partition (the job's default is two), so more schedules share buckets."""

    def __init__(self, lookahead_ms: int = 0, partitions: int = 2, checkpoint: Optional[MemoryCheckpointFiles] = None
                 ) -> None:
        self.lookahead_ms = lookahead_ms
        if checkpoint is None:
            checkpoint = MemoryCheckpointFiles()
            config = Config(partitions=partitions, shards=partitions, given=(("shards", "--shards"),))
        else:
            config = Config(partitions=partitions, given=(("partitions", "--partitions"),))
        self.checkpoint = checkpoint
        self.shards = settle_state_settings(config, wheel.BUCKET_MS, checkpoint)[0].shards
        checkpoint.committed = True
        self.timers: set[tuple[int, int]] = set()
        self.stores = [wheel.MemoryShardStore(shard, self.timers) for shard in range(self.shards)]

    def shard_of(self, key: bytes) -> int:
        return zlib.crc32(key) % self.shards

    def batch(self, now: int, requests: list[tuple[bytes, Request]]) -> tuple[list[Schedule], Counter]:
        per_shard: dict[int, list] = {}
        anonymous: dict[int, list] = {}
        for key, request in requests:
            if wheel.is_internal(key):  # as the processor does: filed in bulk
                anonymous.setdefault(self.shard_of(key), []).append(request.schedule)
            else:
                per_shard.setdefault(self.shard_of(key), []).append((key, request))
        delivered, counts = [], Counter()
        for shard in sorted(set(per_shard) | set(anonymous)):
            shard_counts, due_now, anonymous_due = wheel.apply_requests(
                self.stores[shard], per_shard.get(shard, []), now, wheel.entries_frame(anonymous.get(shard, [])),
                self.lookahead_ms)
            counts.update(shard_counts)
            delivered.extend(due_now)
            delivered.extend(wheel.schedules_of(anonymous_due))
        for timer in sorted(t for t in self.timers if t[0] <= now):
            self.timers.discard(timer)
            for frame in wheel.fire(self.stores[timer[1]], timer[0], now, self.lookahead_ms):
                delivered.extend(wheel.schedules_of(frame))
        return delivered, counts

    def restart(self, lookahead_ms: int, partitions: int) -> "WheelEngine":
        fresh = WheelEngine(lookahead_ms, partitions, self.checkpoint)
        assert fresh.shards == self.shards, "the restart moved ids to other shards"
        fresh.timers.update(self.timers)
        for old, new in zip(self.stores, fresh.stores):
            new.seq = old.seq
            new.index = copy.deepcopy(old.index)
            new.buckets = {b: i.copy() for b, i in old.buckets.items()}
            new.chunks = {k: v.copy() for k, v in old.chunks.items()}
            new.strikes = copy.deepcopy(old.strikes)
            new.armed = copy.deepcopy(old.armed)
        return fresh


ENGINES = [Engine, WheelEngine]
ENGINE_IDS = ["per-id", "wheel"]


# ---------------------------------------------------------------- the reference model


@dataclass
class Version:
    schedule: Schedule
    least_lookahead: int  # the smallest lookahead in force since it was filed


class Reference:
    """The protocol, plainly. ``check_batch`` applies one batch and judges an engine's deliveries."""

    def __init__(self, lookahead_ms: int):
        self.lookahead_ms = lookahead_ms
        self.pending: dict[bytes, Version] = {}

    def restart(self, lookahead_ms: int) -> None:
        self.lookahead_ms = lookahead_ms
        for version in self.pending.values():
            version.least_lookahead = min(version.least_lookahead, lookahead_ms)

    def check_batch(self, now: int, requests: list[tuple[bytes, Request]], delivered: list[Schedule],
                    counts: Counter) -> None:
        expected = Counter()
        for key, request in requests:
            current = self.pending.get(key)
            if request.action is Action.CANCEL:
                expected[Outcome.CANCEL_NOOP if current is None else Outcome.CANCELLED] += 1
                self.pending.pop(key, None)
            elif current is None:
                expected[Outcome.SCHEDULED] += 1
                self.pending[key] = Version(request.schedule, self.lookahead_ms)
            elif current.schedule.same_message(request.schedule):
                expected[Outcome.REPLACE_NOOP] += 1
            else:
                expected[Outcome.REPLACED] += 1
                self.pending[key] = Version(request.schedule, self.lookahead_ms)
        assert counts == expected, f"outcomes at {now}: engine {dict(counts)}, reference {dict(expected)}"

        by_id = {v.schedule.delivery_id: (key, v) for key, v in self.pending.items()}
        seen = Counter(s.delivery_id for s in delivered)
        assert all(n == 1 for n in seen.values()), f"delivered twice in one batch at {now}: {seen}"
        for schedule in delivered:
            assert schedule.delivery_id in by_id, f"at {now}: {schedule} is not pending (cancelled, replaced or done)"
            key, version = by_id[schedule.delivery_id]
            assert schedule == version.schedule, f"at {now}: delivered {schedule}, pending {version.schedule}"
            assert schedule.due_ms <= now + self.lookahead_ms, f"at {now}: {schedule} delivered early"
            del self.pending[key]
        overdue = [v.schedule for v in self.pending.values() if v.schedule.due_ms <= now + v.least_lookahead]
        assert not overdue, f"at {now}: due but not delivered: {overdue}"


# ---------------------------------------------------------------- scripts


@dataclass(frozen=True)
class Op:
    kind: str  # ADD | REPLACE | CANCEL | ADD_NO_ID | RESEND | TWEAK | RESEND_DONE | TWEAK_DONE | CANCEL_DONE
    id: bytes = b""
    due: tuple = ("rel", 0)  # ("rel", offset from the batch time) or ("abs", instant)
    topic: str = "out"
    key: Optional[bytes] = b"k"
    value: Optional[bytes] = b"v"
    headers: tuple = ()
    resend: int = 0  # which earlier request (0 = the latest) to send again; *_DONE: of those delivered
    tweak: str = ""  # TWEAK: the one field to change (due_ms, topic, key, value, headers)


@dataclass(frozen=True)
class Restart:
    lookahead_ms: int
    partitions: int


# Few ids, and due times that often share a bucket with a batch time falling inside it: partial
# fires, re-created buckets and identical re-sends then come up in most scripts.
IDS = [b"a", b"\xff\x00", b"\xfe"]
DUES = st.one_of(st.tuples(st.just("rel"), st.sampled_from([-50, 0, 1, 90, 400, 700, 1000, 2999])),
                 st.tuples(st.just("abs"), st.sampled_from([9_000, 10_000, 10_300, 10_600, 10_999, 11_000, 11_700])))
TOPICS = st.sampled_from(["out", "other"])
KEYS = st.sampled_from([None, b"k", b"\x00k"])
VALUES = st.sampled_from([None, b"", b"x", b"y"])
HEADERS = st.sampled_from([(), (("h", b"1"),), (("h", b"2"),), (("h", b"1"), ("h", b"1")), (("h", None),),
                           (("g", b"1"),)])
LOOKAHEADS = st.sampled_from([0, 0, 300, 1500])
PARTITIONS = st.sampled_from([1, 1, 2, 3])

ops = st.one_of(
    st.builds(Op, st.sampled_from(["ADD", "REPLACE"]), st.sampled_from(IDS), DUES, TOPICS, KEYS, VALUES, HEADERS),
    st.builds(Op, st.just("CANCEL"), st.sampled_from(IDS)),
    st.builds(Op, st.just("ADD_NO_ID"), st.just(b""), DUES, TOPICS, KEYS, VALUES, HEADERS),
    st.builds(Op, st.just("RESEND"), resend=st.integers(0, 8)),
    st.builds(Op, st.just("TWEAK"), resend=st.integers(0, 8),
              tweak=st.sampled_from(["due_ms", "topic", "key", "value", "headers"])),
    # Requests for ids whose version was delivered: the identical re-send, a changed one, a cancel.
    st.builds(Op, st.sampled_from(["RESEND_DONE", "CANCEL_DONE"]), resend=st.integers(0, 3)),
    st.builds(Op, st.just("TWEAK_DONE"), resend=st.integers(0, 3),
              tweak=st.sampled_from(["due_ms", "topic", "key", "value", "headers"])),
)
# A step: a batch of requests, how far the clock moves after it (backwards too), and maybe a restart.
steps = st.lists(st.tuples(
    st.lists(ops, max_size=6),
    st.sampled_from([-1500, -400, -1, 0, 1, 50, 100, 333, 500, 1000, 5000]),
    st.one_of(st.none(), st.none(), st.builds(Restart, LOOKAHEADS, PARTITIONS))), min_size=1, max_size=25)
scripts = st.tuples(LOOKAHEADS, PARTITIONS, steps)


TWEAKED = {  # one field changed, the smallest way that changes the message
    "due_ms": lambda due: due + 1,
    "topic": lambda topic: "other" if topic == "out" else "out",
    "key": lambda key: b"k" if key is None else None,
    "value": lambda value: b"x" if value != b"x" else b"",
    "headers": lambda headers: (("h", b"1"),) if headers != (("h", b"1"),) else (("h", None),),
}


def requests_of(batch: list[Op], now: int, history: list, done: list, offset: int
                ) -> tuple[list[tuple[bytes, Request]], int]:
    """The batch's requests (each with a fresh source offset, hence a fresh delivery id).
    ``history``: every request so far; ``done``: the requests whose version was delivered."""
    out = []
    for op in batch:
        offset += 1
        version = f"requests-0-{offset}"
        if op.kind == "CANCEL_DONE":
            if not done:
                continue
            key, request = done[-1 - op.resend % len(done)][0], Request(Action.CANCEL, None)
            if wheel.is_internal(key):
                continue  # nothing can name a schedule sent without an id
        elif op.kind in ("RESEND", "TWEAK", "RESEND_DONE", "TWEAK_DONE"):
            source = done if op.kind.endswith("_DONE") else history
            if not source:
                continue
            key, request = source[-1 - op.resend % len(source)]
            if request.schedule is not None:
                fields = {**request.schedule.__dict__, "delivery_id": version}
                if op.kind.startswith("TWEAK"):
                    fields[op.tweak] = TWEAKED[op.tweak](fields[op.tweak])
                request = Request(request.action, Schedule(**fields))
            if wheel.is_internal(key):
                key = anon(offset)
        elif op.kind == "CANCEL":
            key, request = sid(op.id), Request(Action.CANCEL, None)
        else:
            due = now + op.due[1] if op.due[0] == "rel" else op.due[1]
            key = anon(offset) if op.kind == "ADD_NO_ID" else sid(op.id)
            action = Action.REPLACE if op.kind == "REPLACE" else Action.ADD
            request = Request(action, Schedule(due, op.topic, op.key, op.value, op.headers, version))
        history.append((key, request))
        out.append((key, request))
    return out, offset


def check_script(script, engine_class) -> None:
    lookahead_ms, partitions, script_steps = script
    engine = engine_class(lookahead_ms, partitions)
    reference = Reference(lookahead_ms)
    now, offset, history, done = 10_000, 0, [], []
    for batch, advance, restart in script_steps:
        requests, offset = requests_of(batch, now, history, done, offset)
        delivered, counts = engine.batch(now, requests)
        reference.check_batch(now, requests, delivered, counts)
        by_version = {r.schedule.delivery_id: (key, r) for key, r in history if r.schedule is not None}
        done.extend(by_version[s.delivery_id] for s in delivered)
        if restart is not None:
            engine = engine.restart(restart.lookahead_ms, restart.partitions)
            reference.restart(restart.lookahead_ms)
        now += advance


PROPERTY_EXAMPLES = 1000


@pytest.mark.parametrize("engine_class", ENGINES, ids=ENGINE_IDS)
@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts)
def test_rules_match_the_reference_model(engine_class, script):
    check_script(script, engine_class)


# ---------------------------------------------------------------- the model test catches broken rules


def _holds_ignoring_fires(self, entry):
    info = self.get(entry.bucket)
    return info is not None and info.created_seq <= entry.seq


def _holds_ignoring_incarnation(self, entry):
    info = self.get(entry.bucket)
    return info is not None and not wheel.delivered_by(info.fires, entry)


def _identical_replace_counted_as_replaced(pending, pending_digest, request):
    outcome, new_pending, new_digest = ORIGINAL_STEP(pending, pending_digest, request)
    if outcome is Outcome.REPLACE_NOOP:
        return Outcome.REPLACED, request.schedule, new_digest
    return outcome, new_pending, new_digest


def _digest_without(field_name: str):
    def mutant(schedule: Schedule) -> bytes:
        blank = {"headers": (), "key": None, "value": None, "topic": ""}[field_name]
        return ORIGINAL_DIGEST(Schedule(**{**schedule.__dict__, field_name: blank}))
    return mutant


def _fire_ignoring_strikes(store, timer_ms, now_ms, lookahead_ms=0):
    for n in [k for k in store.strikes]:
        store.strikes[n] = []
    yield from ORIGINAL_FIRE(store, timer_ms, now_ms, lookahead_ms)


def _timers_without_lookahead(self, bucket, info, timer_ms):
    ORIGINAL_ARM(self, bucket, info, timer_ms + self.lookahead_ms)


ORIGINAL_STEP, ORIGINAL_DIGEST, ORIGINAL_FIRE, ORIGINAL_ARM = wheel.step, wheel.digest, wheel.fire, wheel._Shard.arm

# Each broken rule, and the tests that must catch it: the property test above ("model"; run here
# derandomized, so the check is repeatable) and/or examples written for that defect. The
# generator reaches a re-created bucket too rarely (measured: about one script in 1,500) for the
# property test to be the guard there; a partial fire, about one in 500.
PARTIAL_FIRE_EXAMPLE = "test_requests_after_a_partial_fire_see_the_delivered_version_as_gone"
RECREATED_EXAMPLE = "test_identical_resend_after_delivery_is_scheduled_and_delivered_again"
MUTANTS = {
    "holds ignores partial fires": (wheel._Shard, "holds", _holds_ignoring_fires, ["model", PARTIAL_FIRE_EXAMPLE]),
    "holds ignores re-created buckets": (wheel._Shard, "holds", _holds_ignoring_incarnation, [RECREATED_EXAMPLE]),
    "identical replace counted as replaced": (wheel, "step", _identical_replace_counted_as_replaced, ["model"]),
    "digest ignores headers": (wheel, "digest", _digest_without("headers"), ["model"]),
    "digest ignores the key": (wheel, "digest", _digest_without("key"), ["model"]),
    "digest ignores the value": (wheel, "digest", _digest_without("value"), ["model"]),
    "digest ignores the topic": (wheel, "digest", _digest_without("topic"), ["model"]),
    "strikes skipped at fire": (wheel, "fire", _fire_ignoring_strikes, ["model"]),
    "timers armed without the lookahead": (wheel._Shard, "arm", _timers_without_lookahead, ["model"]),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_model_test_finds_each_broken_rule(mutant, monkeypatch):
    """With one rule of the wheel layout broken, the property test (same generator, at most the same
    number of examples, no shrinking) and the named examples fail."""
    owner, name, replacement, caught_by = MUTANTS[mutant]
    monkeypatch.setattr(owner, name, replacement)

    @settings(max_examples=PROPERTY_EXAMPLES, phases=[Phase.generate], derandomize=True, database=None,
              deadline=None, suppress_health_check=list(HealthCheck))
    @given(script=scripts)
    def model_test(script):
        check_script(script, WheelEngine)

    for test in caught_by:
        with pytest.raises(AssertionError):
            if test == "model":
                model_test()
            else:
                globals()[test](WheelEngine(partitions=1))


# ---------------------------------------------------------------- examples, on both layouts


def run_batches(engine, *batches):
    """Run (now, requests) batches; returns the deliveries and outcome counts of each."""
    return [engine.batch(now, requests) for now, requests in batches]


@pytest.fixture(params=ENGINES, ids=ENGINE_IDS)
def engine(request):
    return request.param(partitions=1)  # one shard: the examples' schedules share buckets


def test_add_then_fire_at_due_time_not_before(engine):
    a = sid("a")
    assert engine.batch(0, [(a, Request(Action.ADD, sched(100)))])[0] == []
    assert engine.batch(99, [])[0] == []
    assert engine.batch(100, [])[0] == [sched(100)]
    assert engine.batch(200, [])[0] == []


def test_due_in_the_past_is_delivered_in_the_same_batch(engine):
    delivered, counts = engine.batch(50, [(sid("a"), Request(Action.ADD, sched(10)))])
    assert delivered == [sched(10)] and counts == Counter({Outcome.SCHEDULED: 1})


def test_within_a_batch_requests_act_before_delivery(engine):
    due_now = Request(Action.ADD, sched(10))
    assert engine.batch(50, [(sid("a"), due_now), (sid("a"), Request(Action.CANCEL, None))]) == (
        [], Counter({Outcome.SCHEDULED: 1, Outcome.CANCELLED: 1}))
    assert engine.batch(60, [(sid("b"), due_now), (sid("b"), due_now)]) == (
        [sched(10)], Counter({Outcome.SCHEDULED: 1, Outcome.REPLACE_NOOP: 1}))


def test_replace_moves_the_schedule_and_the_old_version_never_fires(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100, b"old", "t-0-0")))])
    _, counts = engine.batch(1, [(sid("a"), Request(Action.REPLACE, sched(300, b"new", "t-0-1")))])
    assert counts == Counter({Outcome.REPLACED: 1})
    assert engine.batch(100, [])[0] == []
    assert engine.batch(300, [])[0] == [sched(300, b"new", "t-0-1")]


def test_replace_with_a_past_time_delivers_now_and_old_never_fires(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100, b"old", "t-0-0")))])
    delivered, _ = engine.batch(10, [(sid("a"), Request(Action.REPLACE, sched(5, b"new", "t-0-1")))])
    assert delivered == [sched(5, b"new", "t-0-1")]
    assert engine.batch(1000, [])[0] == []


def test_identical_replace_is_a_noop_that_keeps_the_first_version(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100, b"x", "t-0-0")))])
    _, counts = engine.batch(1, [(sid("a"), Request(Action.REPLACE, sched(100, b"x", "t-0-7")))])
    assert counts == Counter({Outcome.REPLACE_NOOP: 1})
    assert engine.batch(100, [])[0] == [sched(100, b"x", "t-0-0")]


@pytest.mark.parametrize("other", [
    sched(100, headers=(("h", b"2"),), version="t-0-1"),
    sched(100, key=b"other", version="t-0-1"),
    sched(100, key=None, version="t-0-1"),
    sched(100, value=None, version="t-0-1"),
    sched(100, topic="elsewhere", version="t-0-1"),
    sched(101, version="t-0-1"),
], ids=["headers", "key", "null-key", "null-value", "topic", "due"])
def test_replace_that_differs_in_any_field_is_not_a_noop(engine, other):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100)))])
    _, counts = engine.batch(1, [(sid("a"), Request(Action.REPLACE, other))])
    assert counts == Counter({Outcome.REPLACED: 1})
    assert engine.batch(101, [])[0] == [other]


def test_cancel_pending_and_unknown(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100)))])
    _, counts = engine.batch(1, [(sid("a"), Request(Action.CANCEL, None)), (sid("b"), Request(Action.CANCEL, None))])
    assert counts == Counter({Outcome.CANCELLED: 1, Outcome.CANCEL_NOOP: 1})
    assert engine.batch(100, [])[0] == []


def test_cancel_after_delivery_is_a_noop(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(10_000)))])
    assert engine.batch(10_000, [])[0] == [sched(10_000)]
    assert engine.batch(10_001, [(sid("a"), Request(Action.CANCEL, None))])[1] == Counter({Outcome.CANCEL_NOOP: 1})


def test_identical_resend_after_delivery_is_scheduled_and_delivered_again(engine):
    """Defect 2b: a bucket emptied by its fire and then re-created must not revive the index entry of
    the version it delivered."""
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(10_200, version="t-0-1")))])
    assert engine.batch(10_200, [])[0] == [sched(10_200, version="t-0-1")]
    engine.batch(10_250, [(sid("b"), Request(Action.ADD, sched(10_900, b"other", "t-0-2")))])  # bucket 10 again
    delivered, counts = engine.batch(10_300, [(sid("a"), Request(Action.ADD, sched(10_200, version="t-0-3")))])
    assert counts == Counter({Outcome.SCHEDULED: 1}) and delivered == [sched(10_200, version="t-0-3")]
    assert engine.batch(10_400, [(sid("a"), Request(Action.CANCEL, None))])[1] == Counter({Outcome.CANCEL_NOOP: 1})
    assert engine.batch(10_900, [])[0] == [sched(10_900, b"other", "t-0-2")]


def test_requests_after_a_partial_fire_see_the_delivered_version_as_gone(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(10_100, version="t-0-1"))),
                     (sid("b"), Request(Action.ADD, sched(10_900, version="t-0-2")))])
    assert engine.batch(10_500, [])[0] == [sched(10_100, version="t-0-1")]  # bucket 10 partly fired
    assert engine.batch(10_501, [(sid("a"), Request(Action.CANCEL, None))])[1] == Counter({Outcome.CANCEL_NOOP: 1})
    delivered, counts = engine.batch(10_502, [(sid("a"), Request(Action.ADD, sched(10_100, version="t-0-3")))])
    assert counts == Counter({Outcome.SCHEDULED: 1}) and delivered == [sched(10_100, version="t-0-3")]
    assert engine.batch(10_900, [])[0] == [sched(10_900, version="t-0-2")]


def test_identical_resend_after_the_clock_stepped_back_is_scheduled_again(engine):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(10_200, version="t-0-1")))])
    assert engine.batch(10_200, [])[0] == [sched(10_200, version="t-0-1")]
    delivered, counts = engine.batch(10_100, [(sid("a"), Request(Action.ADD, sched(10_200, version="t-0-2")))])
    assert counts == Counter({Outcome.SCHEDULED: 1}) and delivered == []
    assert engine.batch(10_200, [])[0] == [sched(10_200, version="t-0-2")]


def test_replace_after_the_clock_stepped_back_strikes_the_old_version(engine):
    """Defect 2a: a bucket partly fired up to 9.5 s; the clock goes back; a new schedule at 9.3 s is
    pending, and replacing it must not deliver both versions."""
    engine.batch(0, [(sid("early"), Request(Action.ADD, sched(9_100, version="t-0-1"))),
                     (sid("late"), Request(Action.ADD, sched(9_900, version="t-0-2")))])
    assert engine.batch(9_500, [])[0] == [sched(9_100, version="t-0-1")]
    assert engine.batch(9_000, [(sid("b"), Request(Action.ADD, sched(9_300, b"old", "t-0-3")))])[0] == []
    _, counts = engine.batch(9_001, [(sid("b"), Request(Action.REPLACE, sched(9_300, b"new", "t-0-4")))])
    assert counts == Counter({Outcome.REPLACED: 1})
    assert sorted(s.delivery_id for s in engine.batch(10_000, [])[0]) == ["t-0-2", "t-0-4"]


def test_lookahead_lowered_at_restart_loses_nothing():
    """Defect 1: timers set 1.5 s early, then the lookahead goes to 0: everything still fires on time."""
    for engine_class in ENGINES:
        engine = engine_class(lookahead_ms=1500)
        engine.batch(0, [(sid(f"s{i}"), Request(Action.ADD, sched(20_000 + 100 * i, version=f"t-0-{i}")))
                         for i in range(5)])
        engine = engine.restart(lookahead_ms=0, partitions=2)
        assert engine.batch(18_500, [])[0] == []
        assert engine.batch(19_999, [])[0] == []
        assert sorted(s.delivery_id for s in engine.batch(20_250, [])[0]) == ["t-0-0", "t-0-1", "t-0-2"]
        assert sorted(s.delivery_id for s in engine.batch(21_000, [])[0]) == ["t-0-3", "t-0-4"]


def test_lookahead_raised_at_restart_still_delivers_on_time():
    for engine_class in ENGINES:
        engine = engine_class(lookahead_ms=0)
        engine.batch(0, [(sid("a"), Request(Action.ADD, sched(20_000, version="t-0-1")))])
        engine = engine.restart(lookahead_ms=2000, partitions=2)
        # Set under the old lookahead, the timer fires at the due time at the latest.
        assert engine.batch(20_000, [])[0] == [sched(20_000, version="t-0-1")]


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


def test_log_order_of_the_wheel_keeps_each_partition_in_offset_order_and_interleaves_by_time():
    frame = pd.DataFrame([
        ("t", 0, 5, 50), ("t", 1, 1, 20), ("t", 0, 4, 60), ("t", 1, 2, 70), ("u", 0, 9, 10), ("t", 0, 6, 55),
    ], columns=["src_topic", "src_partition", "src_offset", "src_ts_ms"])
    ordered = [tuple(r) for r in log_order(frame)[["src_topic", "src_partition", "src_offset"]].itertuples(
        index=False)]
    assert ordered == [("u", 0, 9), ("t", 1, 1), ("t", 0, 4), ("t", 0, 5), ("t", 0, 6), ("t", 1, 2)]
    # Partition t/0's timestamps go 60, 50, 55 in offset order: its running maximum keeps them in order.
    positions = {row: i for i, row in enumerate(ordered)}
    assert positions[("t", 0, 4)] < positions[("t", 0, 5)] < positions[("t", 0, 6)]


@pytest.mark.parametrize("engine_class", ENGINES, ids=ENGINE_IDS)
@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), cancelled=st.integers(0, 50))
def test_herd_all_due_at_one_instant_is_delivered_in_one_batch_exactly_once(engine_class, n, cancelled):
    engine = engine_class()
    adds = [(sid(f"id{i}"), Request(Action.ADD, sched(1000, b"h", f"t-0-{i}"))) for i in range(n)]
    engine.batch(0, adds)
    engine.batch(1, [(sid(f"id{i}"), Request(Action.CANCEL, None)) for i in range(min(cancelled, n))])
    assert engine.batch(999, [])[0] == []
    delivered, _ = engine.batch(1000, [])
    assert sorted(s.delivery_id for s in delivered) == sorted(f"t-0-{i}" for i in range(min(cancelled, n), n))
    assert engine.batch(5000, [])[0] == []
