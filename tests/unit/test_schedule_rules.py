"""The state layout and the timed writer against a reference model of the protocol, without Spark.

``WheelEngine`` (engine/rules/: batch.py and the modules beside it, plus a model of the driver's timed writer) plays
the part of Spark's transformWithState: per micro-batch they hand each grouping key its
requests at once, in log order, at the batch time, then fire every timer at or before the
batch time. A restart keeps only what a checkpoint keeps (state and timers) and may change
the lookahead and the partitions, as a user restarting with other flags would.

The reference is the protocol written plainly: latest request per id wins (a COMPLETE, a
write-back read back, removes the pending version only if it names it, or names none); after
a batch's requests acted, a pending version is delivered once its due time is reached. With a
lookahead L, "reached" means due <= batch time + L. When L changes between runs, a version
may go out anywhere between the two rules (timers already set keep the old one); the
reference accepts exactly that window and nothing else, so with a fixed lookahead it
demands the one right batch. Outcome counts are compared per batch, and every delivery is
compared in full (due time, destination, key, value, headers, delivery id, partition,
partition key, write-back, history flag).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import pkgutil
import sys
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass

import pandas as pd
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kafka_scheduler import delivery_ids
from kafka_scheduler.config import Config
from kafka_scheduler.delivery_ids import activation_of, firing_id
from kafka_scheduler.engine import rules
from kafka_scheduler.engine.processor.input import log_order
from kafka_scheduler.engine.rules import batch as batch_rules
from kafka_scheduler.engine.rules import cron, index_cache
from kafka_scheduler.engine.rules.batch import expired_mask, mark_expired, step
from kafka_scheduler.engine.rules.buckets import BUCKET_MS, BucketInfo
from kafka_scheduler.engine.rules.cron_rules import (
    DEFAULT_CRON_MIN_INTERVAL_MS,
    replayed_firing_id,
    resumed_at,
    withdraw_firing,
)
from kafka_scheduler.engine.rules.digests import digest
from kafka_scheduler.engine.rules.entries import entries_frame, schedule_of_entry, schedules_of
from kafka_scheduler.engine.rules.schedule import (
    Action,
    Cron,
    Outcome,
    Request,
    Schedule,
    WriteBack,
    completes,
    is_cron,
    is_internal,
)
from kafka_scheduler.engine.rules.shard import ShardTransaction
from kafka_scheduler.engine.rules.store import MemoryShardStore
from kafka_scheduler.engine.spark.checkpoint import settle_state_settings
from kafka_scheduler.protocol import SOURCE_OFFSET

from .model_examples import scaled


def sched(
    due: int,
    value: bytes | None = b"v",
    version: str = "t-0-0",
    topic: str = "out",
    key: bytes | None = b"k",
    headers=(("h", b"1"),),
) -> Schedule:
    return Schedule(due_ms=due, topic=topic, key=key, value=value, headers=tuple(headers), delivery_id=version)


def sid(name: str | bytes) -> bytes:
    return b"id:requests/" + (name.encode() if isinstance(name, str) else name)


def anon(offset: int) -> bytes:
    return f"offset:requests/0/{offset}".encode()


def cron_sid(name: str | bytes) -> bytes:
    return b"cron:requests/" + (name.encode() if isinstance(name, str) else name)


CRON_ACTIONS = (Action.CRON_ADD, Action.CRON_PAUSE, Action.CRON_RESUME, Action.CRON_CANCEL)


class MemoryCheckpointFiles:
    """``checkpoint.CheckpointFiles`` in memory: the settings file a checkpoint keeps."""

    where = "memory"

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.committed = False

    def has_commit(self):
        return self.committed

    def commit(self):
        """What Spark leaves once a batch has committed (checked at a restart): the query id and log entries."""
        self.committed = True
        self.files.setdefault("metadata", b'{"id":"5f1c0d5e-0000-4000-8000-000000000000"}\n')
        for folder in ("offsets", "commits"):
            self.files.setdefault(f"{folder}/0", b"v1\n{}\n")

    def latest(self, folder):
        return 0 if f"{folder}/0" in self.files else None

    def read(self, name):
        return self.files.get(name)

    def write(self, name, data):
        self.files[name] = data


class WheelEngine:
    """The wheel layout driven the same way: shards, buckets, index, timers per bucket.

    The shard count is settled as the job settles it (``checkpoint.settle_state_settings``): the
    first run records it, a restart with other partitions keeps it. The first run here asks for
    one shard per partition (the job's default is two), so more schedules share buckets."""

    def __init__(
        self, lookahead_ms: int = 0, partitions: int = 2, checkpoint: MemoryCheckpointFiles | None = None
    ) -> None:
        self.lookahead_ms = lookahead_ms
        if checkpoint is None:
            checkpoint = MemoryCheckpointFiles()
            config = Config(partitions=partitions, shards=partitions, given=(("shards", "--shards"),))
        else:
            config = Config(partitions=partitions, given=(("partitions", "--partitions"),))
        self.checkpoint = checkpoint
        self.shards = settle_state_settings(config, BUCKET_MS, checkpoint)[0].shards
        checkpoint.commit()
        self.timers: set[tuple[int, int]] = set()
        self.stores = [MemoryShardStore(shard, self.timers) for shard in range(self.shards)]
        self.run = uuid.uuid4().hex  # a new process: its timed writer starts empty
        self.started: int | None = None  # when this run started: its first batch's time
        self.held: dict[str, Schedule] = {}  # the timed writer: prepared deliveries, written at their due time
        self.prepared: list[Schedule] = []
        self.expired: list[Schedule] = []  # of the last batch: written late, rejected as expired
        self.rejected: list = []  # of the last batch: CRON_ADDs the rules refused (frames)
        self.skipped = Counter()  # of the last batch: firings of skip crons missed while the job was down

    def shard_of(self, key: bytes) -> int:
        return zlib.crc32(key) % self.shards

    def batch(self, now: int, requests: list[tuple[bytes, Request]]) -> tuple[list[Schedule], Counter]:
        """Deliveries written by the time this batch ends (the timed writer's, at their due times since the
        last batch, and this batch's own) and outcome counts. What the batch prepared for the writer is in
        ``self.prepared``."""
        if self.started is None:
            self.started = now
        delivered = [s for s in self.held.values() if s.due_ms <= now]  # the writer, between batches
        for schedule in delivered:
            del self.held[schedule.delivery_id]
        per_shard: dict[int, list] = {}
        anonymous: dict[int, list] = {}
        for key, request in requests:
            if is_internal(key):  # as the processor does: filed in bulk
                anonymous.setdefault(self.shard_of(key), []).append(request.schedule)
            else:
                per_shard.setdefault(self.shard_of(key), []).append((key, request))
        counts, emitted = Counter(), []
        self.rejected, self.skipped = [], Counter()
        for shard in sorted(set(per_shard) | set(anonymous)):
            # As the processor does: an ADD or REPLACE (or CRON_ADD) whose id no other request of the batch names
            # goes in bulk.
            of_shard = per_shard.get(shard, [])
            named = Counter(key for key, _ in of_shard)
            is_alone = [named[key] == 1 and r.action in (Action.ADD, Action.REPLACE) for key, r in of_shard]
            is_cron_add = [named[key] == 1 and r.action is Action.CRON_ADD for key, r in of_shard]
            alone = [pair for pair, a in zip(of_shard, is_alone) if a]
            keyed = entries_frame([r.schedule for _, r in alone], [(key, None) for key, _ in alone]).assign(
                action=[r.action.value for _, r in alone]
            )
            adds = [pair for pair, a in zip(of_shard, is_cron_add) if a]
            cron_adds = entries_frame([r.schedule for _, r in adds], [(key, None) for key, _ in adds]).assign(
                raw_headers=[r.raw_headers for _, r in adds],
                delivery_id=[r.activation or r.schedule.delivery_id for _, r in adds],
            )
            result = batch_rules.apply_requests(
                self.stores[shard],
                [pair for pair, a, c in zip(of_shard, is_alone, is_cron_add) if not a and not c],
                now,
                entries_frame(anonymous.get(shard, [])),
                self.lookahead_ms,
                self.run,
                keyed,
                cron_adds,
                started_ms=self.started,
            )
            counts.update(result.outcomes)
            emitted.extend(result.emitted)
            self.rejected.extend(result.rejected)
            self.skipped["skipped"] += result.skipped
            for delivery_id in result.withdrawn:
                self.held.pop(delivery_id, None)
        for timer in sorted(t for t in self.timers if t[0] <= now):
            self.timers.discard(timer)
            emitted.extend(
                batch_rules.fire(
                    self.stores[timer[1]],
                    timer[0],
                    now,
                    self.lookahead_ms,
                    self.run,
                    started_ms=self.started,
                    counts=self.skipped,
                )
            )
        self.prepared, self.expired = [], []
        for frame in emitted:
            for schedule, expired in zip(schedules_of(frame), expired_mask(frame)):
                if expired:
                    assert schedule.due_ms <= now, f"at {now}: {schedule} prepared ahead and marked expired"
                    self.expired.append(schedule)
                elif schedule.due_ms <= now:
                    delivered.append(schedule)
                else:
                    self.prepared.append(schedule)
                    self.held[schedule.delivery_id] = schedule
        return delivered, counts

    def restart(self, lookahead_ms: int, partitions: int) -> WheelEngine:
        """A crash: the writer's held deliveries are lost with the process; state and timers are kept."""
        fresh = self.fresh(lookahead_ms, partitions)
        assert fresh.shards == self.shards, "the restart moved ids to other shards"
        fresh.timers.update(self.timers)
        for old, new in zip(self.stores, fresh.stores):  # fresh caches: worker memory does not survive
            new.seq = old.seq
            new.token = copy.deepcopy(old.token)
            new.deltas = copy.deepcopy(old.deltas)
            new.buckets = {b: i.copy() for b, i in old.buckets.items()}
            new.chunks = {k: v.copy() for k, v in old.chunks.items()}
            new.strikes = copy.deepcopy(old.strikes)
            new.armed = copy.deepcopy(old.armed)
            new.paused = {k: v.copy() for k, v in old.paused.items()}
            new.levels = copy.deepcopy(old.levels)
        return fresh

    def fresh(self, lookahead_ms: int, partitions: int) -> WheelEngine:
        return WheelEngine(lookahead_ms, partitions, self.checkpoint)


ENGINES = [WheelEngine]
ENGINE_IDS = ["wheel"]


# ---------------------------------------------------------------- the reference model


@dataclass
class Version:
    schedule: Schedule
    least_lookahead: int  # the smallest lookahead in force since it was filed
    prepared: bool = False  # handed to the timed writer of the running process


def identical(a: Schedule, b: Schedule) -> bool:
    """Strictly identical versions: every field but the delivery id (what is delivered, when, where, and what
    follows the delivery: write-back, history copy)."""
    return dataclasses.replace(a, delivery_id="") == dataclasses.replace(b, delivery_id="")


def protocol(current: Schedule | None, request: Request) -> tuple[Outcome, Schedule | None]:
    """One request against the version pending under its id: the outcome and what is pending after it."""
    if request.action is Action.CANCEL:
        return (Outcome.CANCEL_NOOP if current is None else Outcome.CANCELLED), None
    if request.action is Action.COMPLETE:
        # A write-back read back: the version it names was delivered. It never touches another (newer) one.
        if current is not None and (request.completes is None or request.completes == current.delivery_id):
            return Outcome.COMPLETED, None
        return Outcome.COMPLETE_NOOP, current
    if current is None:
        return Outcome.SCHEDULED, request.schedule
    if identical(current, request.schedule):
        return Outcome.REPLACE_NOOP, current
    return Outcome.REPLACED, request.schedule


@dataclass
class CronVersion:
    """A cron as the reference sees it: its definition (the CRON_ADD's schedule), the request that activated it
    (CRON_ADD or CRON_RESUME: its firing ids start with it), whether it runs, and ``next``: running, its first
    firing not yet emitted; paused, where a replay resumes (None: none left)."""

    definition: Schedule
    activation: str
    active: bool
    next: int | None
    prepared: dict = dataclasses.field(default_factory=dict)  # instant -> firing held by this run's timed writer
    # A replay due at its resume: its first firing is the one the pause withdrew, with the id it had then
    # (instant, the activation the cron was paused in).
    replayed: tuple[int, str] | None = None

    def firing(self, instant: int) -> Schedule:
        activation = self.replayed[1] if self.replayed and self.replayed[0] == instant else self.activation
        return dataclasses.replace(self.definition, due_ms=instant, delivery_id=firing_id(activation, instant))


def next_firing(definition: Schedule, after: int) -> int | None:
    """The next firing after ``after`` within the cron's bounds (engine/rules/cron.py, itself checked against plain
    zoneinfo arithmetic in test_cron.py)."""
    c = definition.cron
    instant = cron.spec(c.expr, c.tz).next_after(max(after, -1 if c.start_ms is None else c.start_ms - 1))
    return None if instant is None or (c.end_ms is not None and instant > c.end_ms) else instant


def same_cron(a: Schedule, b: Schedule) -> bool:
    return dataclasses.replace(a, due_ms=0, delivery_id="") == dataclasses.replace(b, due_ms=0, delivery_id="")


class Reference:
    """The protocol, plainly. ``check_batch`` applies one batch and judges an engine's deliveries.

    A version the engine prepared (handed to the timed writer) is written at its due time, so a request
    read after that instant no longer finds it; one read before withdraws it. Which batch prepares a
    version is the engine's choice within the rule (due by batch time + lookahead, and at the latest when
    due by batch time + the least lookahead in force since it was filed); everything else is exact."""

    def __init__(self, lookahead_ms: int, min_interval_ms: int = DEFAULT_CRON_MIN_INTERVAL_MS):
        self.lookahead_ms = lookahead_ms
        self.min_interval_ms = min_interval_ms
        self.pending: dict[bytes, Version] = {}
        self.crons: dict[bytes, CronVersion] = {}
        self.latest = -(2**62)  # the latest batch time since the process started
        self.started: int | None = None  # the first batch time of the running process

    def restart(self, lookahead_ms: int) -> None:
        """A crash: the timed writer's prepared deliveries are lost with the process."""
        self.lookahead_ms = lookahead_ms
        self.latest = -(2**62)
        self.started = None
        for version in self.pending.values():
            # A version prepared before the crash is armed to be retired at its due time: the new process
            # writes it then, at the latest, instead of preparing it ahead.
            version.least_lookahead = 0 if version.prepared else min(version.least_lookahead, lookahead_ms)
            version.prepared = False
        for version in self.crons.values():
            if version.prepared:  # emitted again by the new process (at its due time at the latest)
                version.next = min(version.prepared)
                version.prepared = {}

    def _cron_request(self, key: bytes, request: Request, now: int) -> Outcome:
        """One cron request against the cron of its id (protocols.md, "Recurring schedules")."""
        current = self.crons.get(key)
        action = request.action
        if action is Action.CRON_ADD:
            definition = request.schedule
            if cron.problem(definition.cron.expr, definition.cron.tz, self.min_interval_ms) is not None:
                return Outcome.REJECTED
            if current is not None and current.active and same_cron(current.definition, definition):
                return Outcome.CRON_REPLACE_NOOP
            first = next_firing(definition, now)
            if first is None:
                self.crons.pop(key, None)
            else:
                self.crons[key] = CronVersion(definition, request.activation or definition.delivery_id, True, first)
            return Outcome.CRON_ADDED if current is None else Outcome.CRON_REPLACED
        if action is Action.CRON_PAUSE:
            if current is None or not current.active:
                return Outcome.CRON_PAUSE_NOOP
            # The firings the writer holds are withdrawn: a replay resumes from the first of them.
            cursor = min(current.prepared) if current.prepared else current.next
            self.crons[key] = CronVersion(current.definition, current.activation, False, cursor)
            return Outcome.CRON_PAUSED
        if action is Action.CRON_RESUME:
            if current is None or current.active:
                return Outcome.CRON_RESUME_NOOP
            c = current.definition.cron
            if current.next is None:
                first = None
            elif c.policy == "skip":
                first = next_firing(current.definition, max(now, current.next - 1))
            else:
                first = current.next
            if first is None:
                del self.crons[key]
            else:
                replayed = (first, current.activation) if first <= now else None
                self.crons[key] = CronVersion(current.definition, request.activation, True, first, replayed=replayed)
            return Outcome.CRON_RESUMED
        assert action is Action.CRON_CANCEL
        if current is None:
            return Outcome.CRON_CANCEL_NOOP
        del self.crons[key]
        return Outcome.CRON_CANCELLED

    def check_batch(
        self,
        now: int,
        requests: list[tuple[bytes, Request]],
        delivered: list[Schedule],
        counts: Counter,
        prepared: list[Schedule] = (),
        expired: list[Schedule] = (),
        skipped: int | None = None,
    ) -> None:
        if self.started is None:
            self.started = now
        self.latest = max(self.latest, now)
        written = {key: v.schedule for key, v in self.pending.items() if v.prepared and v.schedule.due_ms <= now}
        for key in written:
            del self.pending[key]
        firings: dict[str, Schedule] = {}  # the cron firings this batch delivers: written by the timed writer ...
        for version in self.crons.values():
            for instant in [i for i in version.prepared if i <= now]:
                firing = version.prepared.pop(instant)
                firings[firing.delivery_id] = firing
        expected = Counter()
        for key, request in requests:  # in log order, all before any delivery
            if is_cron(key):
                expected[self._cron_request(key, request, now)] += 1
                continue
            current = self.pending.get(key)
            outcome, after = protocol(None if current is None else current.schedule, request)
            expected[outcome] += 1
            if after is None:
                self.pending.pop(key, None)
            elif current is None or after is not current.schedule:
                self.pending[key] = Version(after, self.lookahead_ms)
        assert counts == expected, f"outcomes at {now}: engine {dict(counts)}, reference {dict(expected)}"

        # ... and every firing due by now of the running crons, in order, unless missed (a skip cron's firing due
        # before this process started) or expired (later than its max lateness).
        late: dict[str, Schedule] = {}
        missed = 0
        for version in self.crons.values():
            c = version.definition.cron
            while version.active and version.next is not None and version.next <= now:
                instant, after = version.next, version.next
                firing = version.firing(instant)
                if c.policy == "skip" and instant < self.started:
                    missed, after = missed + 1, self.started - 1
                elif firing.max_lateness_ms is not None and now - instant > firing.max_lateness_ms:
                    late[firing.delivery_id] = firing
                else:
                    firings[firing.delivery_id] = firing
                version.next = next_firing(version.definition, after)
        engine_firings = [s for s in delivered if s.cron is not None]
        assert {s.delivery_id: s for s in engine_firings} == firings, (
            f"at {now}: cron firings delivered {sorted(s.delivery_id for s in engine_firings)}, "
            f"expected {sorted(firings)}"
        )
        assert {s.delivery_id: s for s in expired if s.cron is not None} == late, (
            f"at {now}: cron firings expired {sorted(s.delivery_id for s in expired if s.cron is not None)}, "
            f"expected {sorted(late)}"
        )
        if skipped is not None and skipped > missed:
            # A batch run again with the stopped job's earlier time may prepare a skip cron's firing due after that
            # time but before this process started: missed all the same (ShardTransaction.missed_skip_firings).
            # Preparing it now is the engine's choice, within the lookahead; what a batch prepares is the earliest
            # first.
            early = sorted(
                (version.next, i, version)
                for i, version in enumerate(self.crons.values())
                if version.active
                and version.next is not None
                and version.definition.cron.policy == "skip"
                and now < version.next < self.started
                and version.next <= self.latest + self.lookahead_ms
            )
            for _, _, version in early[: skipped - missed]:
                missed += 1
                version.next = next_firing(version.definition, self.started - 1)
        if skipped is not None:
            assert skipped == missed, f"at {now}: {skipped} firings skipped, expected {missed}"
        last: dict[str, int] = {}
        for firing in engine_firings:  # in order, per cron activation
            activation = activation_of(firing.delivery_id)
            assert firing.due_ms > last.get(activation, -(2**62)), f"at {now}: firings out of order: {engine_firings}"
            last[activation] = firing.due_ms
        delivered = [s for s in delivered if s.cron is None]

        seen = Counter(s.delivery_id for s in delivered)
        assert all(n == 1 for n in seen.values()), f"delivered twice in one batch at {now}: {seen}"
        by_id = {v.schedule.delivery_id: (key, v) for key, v in self.pending.items()}
        for schedule in written.values():
            assert schedule.delivery_id in seen, f"at {now}: prepared {schedule} was not written at its due time"
        for schedule, is_expired in [(s, False) for s in delivered] + [(s, True) for s in expired if s.cron is None]:
            if schedule.delivery_id in {s.delivery_id for s in written.values()}:
                assert not is_expired, f"at {now}: {schedule} written by the timed writer at its due time, expired"
                continue
            assert schedule.delivery_id in by_id, f"at {now}: {schedule} is not pending (cancelled, replaced or done)"
            key, version = by_id[schedule.delivery_id]
            assert schedule == version.schedule, f"at {now}: delivered {schedule}, pending {version.schedule}"
            assert not version.prepared, f"at {now}: {schedule} written twice (prepared before)"
            assert schedule.due_ms <= now, f"at {now}: {schedule} delivered early"
            too_late = schedule.max_lateness_ms is not None and now - schedule.due_ms > schedule.max_lateness_ms
            assert is_expired == too_late, f"at {now}: {schedule} {'expired' if is_expired else 'delivered'}"
            del self.pending[key]
        for schedule in sorted([s for s in prepared if s.cron is not None], key=lambda s: s.due_ms):
            versions = [v for v in self.crons.values() if v.activation == activation_of(schedule.delivery_id)]
            assert versions, f"at {now}: prepared firing {schedule} of no running cron"
            version = versions[0]
            assert version.active and schedule == version.firing(version.next), (
                f"at {now}: prepared {schedule}, the cron's next firing is {version.next}"
            )
            assert now < schedule.due_ms <= self.latest + self.lookahead_ms, f"at {now}: {schedule} prepared too early"
            version.prepared[schedule.due_ms] = schedule
            version.next = next_firing(version.definition, schedule.due_ms)
        for schedule in [s for s in prepared if s.cron is None]:
            assert schedule.delivery_id in by_id, f"at {now}: prepared {schedule}, which is not pending"
            key, version = by_id[schedule.delivery_id]
            assert schedule == version.schedule, f"at {now}: prepared {schedule}, pending {version.schedule}"
            assert not version.prepared, f"at {now}: {schedule} prepared twice"
            # The latest batch time of the run, not this one: a bucket prepared before the clock went back
            # stays prepared.
            assert now < schedule.due_ms <= self.latest + self.lookahead_ms, f"at {now}: {schedule} prepared too early"
            version.prepared = True
        overdue = [
            v.schedule for v in self.pending.values() if not v.prepared and v.schedule.due_ms <= now + v.least_lookahead
        ]
        assert not overdue, f"at {now}: due but neither delivered nor prepared: {overdue}"
        # A running cron with nothing left to fire leaves state once its last firing is retired (by this batch).
        for key in [k for k, v in self.crons.items() if v.active and v.next is None and not v.prepared]:
            del self.crons[key]


# ---------------------------------------------------------------- scripts


@dataclass(frozen=True)
class Extras:
    """What the write-back dialects add to a schedule (None on an Op: a native request, none of it)."""

    partition: int | None
    partition_key: bytes | None
    write_back: str  # "": none; "offset": headers name the request's offset, as every write-back dialect's do;
    # "offset+": that and a dialect header; "fixed": headers that do not change per request
    history: bool


@dataclass(frozen=True)
class Op:
    kind: str  # ADD | REPLACE | CANCEL | ADD_NO_ID | RESEND | TWEAK | COMPLETE | RESEND_DONE | TWEAK_DONE
    # | CANCEL_DONE | COMPLETE_DONE | CRON_ADD | CRON_PAUSE | CRON_RESUME | CRON_CANCEL
    id: bytes = b""
    due: tuple = ("rel", 0)  # ("rel", offset from the batch time) or ("abs", instant)
    topic: str = "out"
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: tuple = ()
    resend: int = 0  # which earlier request (0 = the latest) to send again; *_DONE: of those delivered
    tweak: str = ""  # TWEAK: the one field to change (see TWEAKED)
    extras: Extras | None = None  # ADD, REPLACE, ADD_NO_ID
    target: str = ""  # COMPLETE: which version the write-back names (see COMPLETE_TARGETS)
    max_lateness: int | None = None  # ADD, REPLACE, ADD_NO_ID, CRON_ADD
    cron: CronOp | None = None  # CRON_ADD


@dataclass(frozen=True)
class CronOp:
    expr: str
    tz: str | None
    policy: str
    start: int | None  # bounds, relative to the batch time
    end: int | None


@dataclass(frozen=True)
class Restart:
    lookahead_ms: int
    partitions: int


# Few ids, and due times that often share a bucket with a batch time falling inside it: partial
# fires, re-created buckets and identical re-sends then come up in most scripts.
IDS = [b"a", b"\xff\x00", b"\xfe"]
DUES = st.one_of(
    st.tuples(st.just("rel"), st.sampled_from([-50, 0, 1, 90, 400, 700, 1000, 2999])),
    st.tuples(st.just("abs"), st.sampled_from([9_000, 10_000, 10_300, 10_600, 10_999, 11_000, 11_700])),
)
TOPICS = st.sampled_from(["out", "other"])
KEYS = st.sampled_from([None, b"k", b"\x00k"])
VALUES = st.sampled_from([None, b"", b"x", b"y"])
HEADERS = st.sampled_from(
    [(), (("h", b"1"),), (("h", b"2"),), (("h", b"1"), ("h", b"1")), (("h", None),), (("g", b"1"),)]
)
EXTRAS = st.one_of(
    st.none(),
    st.builds(
        Extras,
        st.sampled_from([None, 0, 1, 2]),
        st.sampled_from([None, b"", b"pk", b"\x00pk"]),
        st.sampled_from(["", "offset", "offset", "offset+", "fixed"]),
        st.booleans(),
    ),
)
LOOKAHEADS = st.sampled_from([0, 0, 300, 1500])
MAX_LATENESS = st.sampled_from([None, None, None, 1, 400, 3000])
# Every 5 or 10 s, or twice a minute (5 s and 55 s apart); one firing too often for the 5 s minimum (rejected),
# one invalid (rejected); a zone (no daylight saving in 1970, the instants of the scripts).
CRON_IDS = [b"a", b"c"]
CRONS = st.builds(
    CronOp,
    st.sampled_from(
        [
            "* * * * * */5",
            "* * * * * */5",
            "* * * * * */5",
            "* * * * * */10",
            "* * * * * 0,5",
            "* * * * * */4",
            "* * * *",
        ]
    ),
    st.sampled_from([None, None, "Europe/Paris"]),
    st.sampled_from(["replay", "skip"]),
    st.sampled_from([None, None, -5000, 3000]),
    st.sampled_from([None, None, 9000, 30_000]),
)
PARTITIONS = st.sampled_from([1, 1, 2, 3])
TWEAK_FIELDS = st.sampled_from(
    ["due_ms", "topic", "key", "value", "headers", "partition", "partition_key", "write_back", "history"]
)
# The version a COMPLETE (a write-back read back) names: the one pending under the id (if none, another
# id's, else the id's latest); an older one of the id (replaced, cancelled, delivered, or a no-op re-send's:
# never pending); one never seen; none at all (Sky: whatever is pending). COMPLETE_DONE names a delivered
# version: the usual write-back, read back after its delivery.
COMPLETE_TARGETS = st.sampled_from(["pending", "pending", "older", "unknown", "none"])

OP_KINDS = [  # (strategy, weight): mostly requests that file schedules, so buckets fill and fire in part
    (
        st.builds(
            Op,
            st.sampled_from(["ADD", "REPLACE"]),
            st.sampled_from(IDS),
            DUES,
            TOPICS,
            KEYS,
            VALUES,
            HEADERS,
            extras=EXTRAS,
        ),
        3,
    ),
    (st.builds(Op, st.just("CANCEL"), st.sampled_from(IDS)), 1),
    (st.builds(Op, st.just("ADD_NO_ID"), st.just(b""), DUES, TOPICS, KEYS, VALUES, HEADERS, extras=EXTRAS), 2),
    (st.builds(Op, st.just("RESEND"), resend=st.integers(0, 8)), 1),
    (st.builds(Op, st.just("TWEAK"), resend=st.integers(0, 8), tweak=TWEAK_FIELDS), 1),
    # Requests for ids whose version was delivered: the identical re-send, a changed one, a cancel, the
    # delivered version's write-back read back.
    (st.builds(Op, st.sampled_from(["RESEND_DONE", "CANCEL_DONE", "COMPLETE_DONE"]), resend=st.integers(0, 3)), 1),
    (st.builds(Op, st.just("TWEAK_DONE"), resend=st.integers(0, 3), tweak=TWEAK_FIELDS), 1),
    (st.builds(Op, st.just("COMPLETE"), st.sampled_from(IDS), target=COMPLETE_TARGETS, resend=st.integers(0, 8)), 1),
]
ops = st.sampled_from([kind for kind, weight in OP_KINDS for _ in range(weight)]).flatmap(lambda kind: kind)
# A step: a batch of requests, how far the clock moves after it (backwards too), and maybe a restart.
steps = st.lists(
    st.tuples(
        st.lists(ops, max_size=6),
        st.sampled_from([-1500, -400, -1, 0, 1, 50, 100, 333, 500, 1000, 5000]),
        st.one_of(st.none(), st.none(), st.builds(Restart, LOOKAHEADS, PARTITIONS)),
    ),
    min_size=1,
    max_size=25,
)
scripts = st.tuples(LOOKAHEADS, PARTITIONS, steps)

# Scripts for recurring schedules: mostly cron requests (with one-shots beside them), and a clock that moves in
# steps of the crons' periods, so firings come due, are prepared, missed while "down" (a restart and a jump),
# replayed, skipped and expired.
# (``scripts`` above is left as it was before crons: the mutants of the one-shot rules are caught within its
# derandomized examples, which another distribution would shift.)
CRON_OP_KINDS = [  # one-shots beside them, with max lateness, and tweaked re-sends (the max lateness too)
    (
        st.builds(
            Op,
            st.sampled_from(["ADD", "REPLACE"]),
            st.sampled_from(IDS),
            DUES,
            TOPICS,
            KEYS,
            VALUES,
            HEADERS,
            extras=EXTRAS,
            max_lateness=MAX_LATENESS,
        ),
        1,
    ),
    (OP_KINDS[1][0], 1),
    (
        st.builds(
            Op,
            st.just("ADD_NO_ID"),
            st.just(b""),
            DUES,
            TOPICS,
            KEYS,
            VALUES,
            HEADERS,
            extras=EXTRAS,
            max_lateness=MAX_LATENESS,
        ),
        1,
    ),
    (
        st.builds(
            Op,
            st.just("TWEAK"),
            resend=st.integers(0, 8),
            tweak=st.sampled_from(["due_ms", "value", "max_lateness_ms"]),
        ),
        1,
    ),
    (
        st.builds(
            Op,
            st.just("CRON_ADD"),
            st.sampled_from(CRON_IDS),
            topic=TOPICS,
            key=KEYS,
            value=VALUES,
            headers=HEADERS,
            max_lateness=MAX_LATENESS,
            cron=CRONS,
        ),
        4,
    ),
    (
        st.builds(
            Op,
            st.sampled_from(["CRON_PAUSE", "CRON_PAUSE", "CRON_RESUME", "CRON_RESUME", "CRON_RESUME", "CRON_CANCEL"]),
            st.sampled_from(CRON_IDS),
        ),
        6,
    ),
    (st.builds(Op, st.just("RESEND"), resend=st.integers(0, 8)), 1),
]
cron_ops = st.sampled_from([kind for kind, weight in CRON_OP_KINDS for _ in range(weight)]).flatmap(lambda kind: kind)
cron_steps = st.lists(
    st.tuples(
        st.lists(cron_ops, max_size=4),
        st.sampled_from([-1500, 0, 1, 700, 1500, 2500, 2500, 4000, 5000, 5000, 9000, 30_000]),
        st.one_of(st.none(), st.none(), st.none(), st.builds(Restart, LOOKAHEADS, PARTITIONS)),
    ),
    min_size=1,
    max_size=25,
)
cron_scripts = st.tuples(LOOKAHEADS, PARTITIONS, cron_steps)


def write_back_of(kind: str, key: bytes | None, offset: int) -> WriteBack | None:
    """The write-back of the request at ``offset`` of partition 0 of "requests"."""
    if not kind:
        return None
    headers = {
        "offset": ((SOURCE_OFFSET, str(offset).encode()),),
        "offset+": ((SOURCE_OFFSET, str(offset).encode()), ("dialect", key)),
        "fixed": (("x", None),),
    }[kind]
    return WriteBack("requests", 0, key, headers)


def written_back_at(back: WriteBack | None, offset: int) -> WriteBack | None:
    """A re-sent request's write-back: it names the new request's offset."""
    if back is None:
        return None
    return dataclasses.replace(
        back,
        headers=tuple((name, str(offset).encode() if name == SOURCE_OFFSET else value) for name, value in back.headers),
    )


TWEAKED = {  # one field changed, the smallest way that changes the message
    "due_ms": lambda due: due + 1,
    "topic": lambda topic: "other" if topic == "out" else "out",
    "key": lambda key: b"k" if key is None else None,
    "value": lambda value: b"x" if value != b"x" else b"",
    "headers": lambda headers: (("h", b"1"),) if headers != (("h", b"1"),) else (("h", None),),
    "partition": lambda partition: 0 if partition is None else None if partition else 1,
    "partition_key": lambda partition_key: b"pk" if partition_key is None else None,
    "write_back": lambda back: (
        WriteBack("requests", 0, None, (("x", None),))
        if back is None
        else dataclasses.replace(back, headers=back.headers + (("t", b""),))
    ),
    "history": lambda history: not history,
    "max_lateness_ms": lambda lateness: 500 if lateness is None else None,
}


def requests_of(
    batch: list[Op], now: int, history: list, done: list, offset: int, pending: dict | None = None
) -> tuple[list[tuple[bytes, Request]], int]:
    """The batch's requests (each with a fresh source offset, hence a fresh delivery id).
    ``history``: every request so far; ``done``: the requests whose version was delivered;
    ``pending``: id -> the version pending before the batch (the reference's), followed through the
    batch's requests so that a COMPLETE can name the version pending when it is read."""
    pending = dict(pending or {})
    out = []
    for op in batch:
        offset += 1
        version = f"requests-0-{offset}"
        if op.kind in ("CANCEL_DONE", "COMPLETE_DONE"):
            if not done:
                continue
            key, delivered = done[-1 - op.resend % len(done)]
            if is_internal(key):
                continue  # nothing can name a schedule sent without an id
            request = (
                Request(Action.CANCEL, None)
                if op.kind == "CANCEL_DONE"
                else Request(Action.COMPLETE, None, delivered.schedule.delivery_id)
            )
        elif op.kind == "COMPLETE":
            key = sid(op.id)
            current = pending.get(key)
            versions = [(key, r.schedule.delivery_id) for k, r in history if k == key and r.schedule is not None]
            if op.target == "pending":  # the id's pending version; else another id's; else the id's latest
                named = (
                    [(key, current.delivery_id)]
                    if current is not None
                    else [(k, s.delivery_id) for k, s in pending.items() if s is not None and not is_internal(k)]
                    or versions[-1:]
                )
            elif op.target == "older":
                named = [(k, v) for k, v in versions if current is None or v != current.delivery_id]
            else:
                named = [(key, f"elsewhere-0-{op.resend}" if op.target == "unknown" else None)]
            if not named:
                continue
            key, name = named[-1 - op.resend % len(named)]
            request = Request(Action.COMPLETE, None, name)
        elif op.kind in ("RESEND", "TWEAK", "RESEND_DONE", "TWEAK_DONE"):
            source = done if op.kind.endswith("_DONE") else history
            if not source:
                continue
            key, request = source[-1 - op.resend % len(source)]
            if request.action in CRON_ACTIONS:  # a cron request sent again (tweaks are for one-shots)
                if op.kind.startswith("TWEAK"):
                    continue
                schedule = (
                    None if request.schedule is None else dataclasses.replace(request.schedule, delivery_id=version)
                )
                request = dataclasses.replace(request, schedule=schedule, activation=version)
            elif request.schedule is not None:
                fields = {
                    **request.schedule.__dict__,
                    "delivery_id": version,
                    "write_back": written_back_at(request.schedule.write_back, offset),
                }
                if op.kind.startswith("TWEAK"):
                    fields[op.tweak] = TWEAKED[op.tweak](fields[op.tweak])
                request = Request(request.action, Schedule(**fields))
            if is_internal(key):
                key = anon(offset)
        elif op.kind == "CANCEL":
            key, request = sid(op.id), Request(Action.CANCEL, None)
        elif op.kind == "CRON_ADD":
            c = op.cron
            definition = Cron(
                c.expr,
                c.tz,
                c.policy,
                None if c.start is None else now + c.start,
                None if c.end is None else now + c.end,
            )
            key = cron_sid(op.id)
            request = Request(
                Action.CRON_ADD,
                Schedule(
                    0, op.topic, op.key, op.value, op.headers, version, max_lateness_ms=op.max_lateness, cron=definition
                ),
                raw_headers=(("x-scheduler-action", b"CRON_ADD"), *op.headers),
                activation=version,
            )
        elif op.kind.startswith("CRON_"):
            key, request = cron_sid(op.id), Request(Action(op.kind), None, activation=version)
        else:
            due = now + op.due[1] if op.due[0] == "rel" else op.due[1]
            key = anon(offset) if op.kind == "ADD_NO_ID" else sid(op.id)
            action = Action.REPLACE if op.kind == "REPLACE" else Action.ADD
            extras = {}
            if op.extras is not None:
                extras = dict(
                    partition=op.extras.partition,
                    partition_key=op.extras.partition_key,
                    write_back=write_back_of(op.extras.write_back, op.id or None, offset),
                    history=op.extras.history,
                )
            request = Request(
                action,
                Schedule(
                    due, op.topic, op.key, op.value, op.headers, version, max_lateness_ms=op.max_lateness, **extras
                ),
            )
        if not is_cron(key):
            pending[key] = protocol(pending.get(key), request)[1]
        history.append((key, request))
        out.append((key, request))
    return out, offset


def check_script(script, engine_class) -> None:
    lookahead_ms, partitions, script_steps = script
    engine = engine_class(lookahead_ms, partitions)
    reference = Reference(lookahead_ms)
    now, offset, history, done = 10_000, 0, [], []
    for batch, advance, restart in script_steps:
        pending = {key: v.schedule for key, v in reference.pending.items()}
        requests, offset = requests_of(batch, now, history, done, offset, pending)
        delivered, counts = engine.batch(now, requests)
        reference.check_batch(
            now, requests, delivered, counts, engine.prepared, engine.expired, engine.skipped["skipped"]
        )
        by_version = {r.schedule.delivery_id: (key, r) for key, r in history if r.schedule is not None}
        done.extend(by_version[s.delivery_id] for s in delivered if s.cron is None)
        if restart is not None:
            engine = engine.restart(restart.lookahead_ms, restart.partitions)
            reference.restart(restart.lookahead_ms)
        now += advance


# Examples per run (model_examples.py): the derandomized mutant tests below fail by example 290 at most ("digest
# ignores the value"; 16-770 over seeds 0-9, mean 181), times 3.
PROPERTY_EXAMPLES = 900


@pytest.mark.parametrize("engine_class", ENGINES, ids=ENGINE_IDS)
@settings(max_examples=scaled(PROPERTY_EXAMPLES), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=scripts)
def test_rules_match_the_reference_model(engine_class, script):
    check_script(script, engine_class)


# The cron mutants the property test is named for fail well within this many examples; "digest ignores the max
# lateness" is found late and for some seeds only, so a named example pins it instead.
CRON_PROPERTY_EXAMPLES = 500


@pytest.mark.parametrize("engine_class", ENGINES, ids=ENGINE_IDS)
@settings(max_examples=scaled(CRON_PROPERTY_EXAMPLES), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=cron_scripts)
def test_cron_rules_match_the_reference_model(engine_class, script):
    """Add, replace, pause, resume (replay and skip), cancel, bounds, expiry, restarts (and jumps of the clock while
    "down"), next to one-shots with the same ids."""
    check_script(script, engine_class)


# ---------------------------------------------------------------- the model test catches broken rules


def _forget_nothing(self, delivered):
    pass


def _forget_nothing_due(self, first_ms, last_ms, live_with_id):
    pass


def _identical_replace_counted_as_replaced(pending, pending_digest, request):
    outcome, new_pending, new_digest = ORIGINAL_STEP(pending, pending_digest, request)
    if outcome is Outcome.REPLACE_NOOP:
        return Outcome.REPLACED, request.schedule, new_digest
    return outcome, new_pending, new_digest


def _digest_without(field_name: str):
    def mutant(schedule: Schedule) -> bytes:
        blank = {
            "headers": (),
            "key": None,
            "value": None,
            "topic": "",
            "write_back": None,
            "partition": None,
            "partition_key": None,
            "history": False,
            "max_lateness_ms": None,
        }[field_name]
        return ORIGINAL_DIGEST(Schedule(**{**schedule.__dict__, field_name: blank}))

    return mutant


def _entries_without(field_name: str):
    def mutant(row) -> Schedule:
        blank = {"partition": None, "partition_key": None, "write_back": None, "history": False}[field_name]
        return dataclasses.replace(ORIGINAL_SCHEDULE_OF_ENTRY(row), **{field_name: blank})

    return mutant


def _completes_whatever_is_pending(request, pending_delivery_id):
    return True


def _completes_nothing(request, pending_delivery_id):
    return False


def _fire_ignoring_strikes(store, timer_ms, now_ms, window_ms=0, run="", **kwargs):
    for n in list(store.strikes):
        store.strikes[n] = []
    yield from ORIGINAL_FIRE(store, timer_ms, now_ms, window_ms, run, **kwargs)


def _timers_without_lookahead(self, bucket, info, timer_ms):
    ORIGINAL_ARM(self, bucket, info, timer_ms + self.window_ms)


def _resume_always_skips(definition, cursor, now_ms):
    return cron.first_firing(
        definition.expr, definition.tz, max(now_ms, cursor - 1), definition.start_ms, definition.end_ms
    )


def _first_firing_without_bounds(expr, tz, after_ms, start_ms=None, end_ms=None):
    return ORIGINAL_FIRST_FIRING(expr, tz, after_ms)


def _no_next_firings(self):
    self.cron_gone = []
    return iter(())


ORIGINAL_STEP, ORIGINAL_DIGEST, ORIGINAL_FIRE, ORIGINAL_ARM = step, digest, batch_rules.fire, ShardTransaction.arm
ORIGINAL_FIRST_FIRING = cron.first_firing
ORIGINAL_SCHEDULE_OF_ENTRY = schedule_of_entry
# The delivery ids' grammar is the rules' too (a firing's id), kept outside rules/ for the client.
RULES_MODULES = [
    importlib.import_module(f"{rules.__name__}.{m.name}") for m in pkgutil.iter_modules(rules.__path__)
] + [delivery_ids]


def everywhere(function, replacement) -> list:
    """Patches of ``function`` in the rules module that defines it and in every rules module that imported it by name:
    a patch of one module does not reach a ``from x import f`` elsewhere, and a rule left unpatched there would go on
    being tested under a mutant that no longer breaks it."""
    holders = [m for m in RULES_MODULES if getattr(m, function.__name__, None) is function]
    assert sys.modules[function.__module__] in holders, function
    return [(module, function.__name__, replacement) for module in holders]


# Each broken rule: what it patches, the tests that must catch it, and the layouts they run on. The
# tests are the property test above ("model"; run here derandomized, so the check is repeatable)
# and/or examples written for that defect. The generator reaches a re-created bucket too rarely
# (measured: about one script in 1,500) for the property test to be the guard there. A partial fire
# followed by a request for the id it delivered comes up in about one script in 60 (in bursts: with
# 12 of 13 seeds tried, the first within 1,000 scripts), hence the example next to "model".
PARTIAL_FIRE_EXAMPLE = "test_requests_after_a_partial_fire_see_the_delivered_version_as_gone"
RECREATED_EXAMPLE = "test_identical_resend_after_delivery_is_scheduled_and_delivered_again"
OLD_WRITE_BACK_EXAMPLE = "test_a_write_back_naming_an_old_version_never_cancels_the_newer_one"
RESEND_WRITE_BACK_EXAMPLE = "test_write_back_of_the_delivered_version_after_a_resend_is_a_noop"
REBUILD_EXAMPLE = "test_write_back_read_back_with_its_schedule_completes_it"
FIELDS_EXAMPLE = "test_partition_key_partition_write_back_and_history_come_out_of_both_layouts"
DIALECT_FIELDS_EXAMPLE = "test_replace_that_differs_only_in_what_a_dialect_adds_is_not_a_noop"
EXPIRY_EXAMPLE = "test_a_delivery_later_than_its_max_lateness_is_expired"
LATENESS_REPLACE_EXAMPLE = "test_a_replace_that_changes_only_the_max_lateness_is_a_new_version"
DOWNTIME_EXAMPLE = "test_firings_missed_while_the_job_was_down_are_replayed_in_order_or_skipped"
PAUSE_EXAMPLE = "test_a_pause_withdraws_the_held_firing_and_a_resume_replays_or_skips"
FIRINGS_EXAMPLE = "test_a_cron_fires_at_each_instant_with_a_delivery_id_of_its_own"
WHEEL = BOTH = [WheelEngine]
MUTANTS = {
    "fire leaves delivered ids in the index": (
        # (After a partial fire the prepare mark also tells the delivered version is gone: the partial-fire
        # example cannot catch this one.)
        [(ShardTransaction, "forget", _forget_nothing), (index_cache.IndexSession, "forget_due", _forget_nothing_due)],
        ["model", RECREATED_EXAMPLE],
        WHEEL,
    ),
    "a whole bucket's ids stay in the index": (
        [(index_cache.IndexSession, "forget_due", _forget_nothing_due)],
        ["model"],
        WHEEL,
    ),
    "a bucket's ids leave the index one by one only": (
        # A bucket partly retired: its due ids leave one by one.
        [(ShardTransaction, "forget", _forget_nothing)],
        ["model"],
        WHEEL,
    ),
    "identical replace counted as replaced": (
        everywhere(ORIGINAL_STEP, _identical_replace_counted_as_replaced),
        ["model"],
        WHEEL,
    ),
    "digest ignores headers": (everywhere(ORIGINAL_DIGEST, _digest_without("headers")), ["model"], WHEEL),
    "digest ignores the key": (everywhere(ORIGINAL_DIGEST, _digest_without("key")), ["model"], WHEEL),
    "digest ignores the value": (everywhere(ORIGINAL_DIGEST, _digest_without("value")), ["model"], WHEEL),
    "digest ignores the topic": (everywhere(ORIGINAL_DIGEST, _digest_without("topic")), ["model"], WHEEL),
    "strikes skipped at fire": (everywhere(ORIGINAL_FIRE, _fire_ignoring_strikes), ["model"], WHEEL),
    "timers armed without the lookahead": ([(ShardTransaction, "arm", _timers_without_lookahead)], ["model"], WHEEL),
    # Prepared deliveries (the timed writer): withdrawn, written once, and re-emitted after a crash.
    "replaced or cancelled prepared versions are not withdrawn": (
        [(ShardTransaction, "may_be_held", lambda self, entry: False)],
        ["model"],
        WHEEL,
    ),
    "prepared versions due by now still count as pending": (
        [(ShardTransaction, "written", lambda self, entry: False)],
        ["model"],
        WHEEL,
    ),
    "the prepare mark of another run counts": (
        [(BucketInfo, "prepared_through", lambda self, run: self.prep_through if self.prep_run else None)],
        ["model"],
        WHEEL,
    ),
    # COMPLETE, write-backs and the fields the write-back dialects add.
    "complete ignores the named version": (
        everywhere(completes, _completes_whatever_is_pending),
        ["model", OLD_WRITE_BACK_EXAMPLE, RESEND_WRITE_BACK_EXAMPLE],
        BOTH,
    ),
    "complete never completes": (
        everywhere(completes, _completes_nothing),
        ["model", REBUILD_EXAMPLE],
        BOTH,
    ),
    "digest ignores the write-back": (
        everywhere(ORIGINAL_DIGEST, _digest_without("write_back")),
        ["model", OLD_WRITE_BACK_EXAMPLE, DIALECT_FIELDS_EXAMPLE],
        WHEEL,
    ),
    "digest ignores the partition": (
        everywhere(ORIGINAL_DIGEST, _digest_without("partition")),
        ["model", DIALECT_FIELDS_EXAMPLE],
        WHEEL,
    ),
    "digest ignores the partition key": (
        everywhere(ORIGINAL_DIGEST, _digest_without("partition_key")),
        ["model", DIALECT_FIELDS_EXAMPLE],
        WHEEL,
    ),
    "digest ignores the history flag": (
        everywhere(ORIGINAL_DIGEST, _digest_without("history")),
        ["model", DIALECT_FIELDS_EXAMPLE],
        WHEEL,
    ),
    "entries lose the partition": (
        everywhere(ORIGINAL_SCHEDULE_OF_ENTRY, _entries_without("partition")),
        ["model", FIELDS_EXAMPLE],
        WHEEL,
    ),
    "entries lose the partition key": (
        everywhere(ORIGINAL_SCHEDULE_OF_ENTRY, _entries_without("partition_key")),
        ["model", FIELDS_EXAMPLE],
        WHEEL,
    ),
    "entries lose the write-back": (
        everywhere(ORIGINAL_SCHEDULE_OF_ENTRY, _entries_without("write_back")),
        ["model", FIELDS_EXAMPLE],
        WHEEL,
    ),
    "entries lose the history flag": (
        everywhere(ORIGINAL_SCHEDULE_OF_ENTRY, _entries_without("history")),
        ["model", FIELDS_EXAMPLE],
        WHEEL,
    ),
    # Expiry and recurring schedules ("cron-model": the property test over cron_scripts).
    "digest ignores the max lateness": (
        everywhere(ORIGINAL_DIGEST, _digest_without("max_lateness_ms")),
        # The property test finds this one late and only for some seeds: a named example pins it.
        [LATENESS_REPLACE_EXAMPLE],
        WHEEL,
    ),
    "an expired delivery is delivered": (
        everywhere(mark_expired, lambda frame, now_ms: frame),
        ["cron-model", EXPIRY_EXAMPLE],
        WHEEL,
    ),
    "the skip policy is ignored (missed firings delivered)": (
        [(ShardTransaction, "missed_skip_firings", lambda self, frame, emit: None)],
        ["cron-model", DOWNTIME_EXAMPLE],
        WHEEL,
    ),
    "the replay policy is ignored on resume (firings missed while paused dropped)": (
        everywhere(resumed_at, _resume_always_skips),
        ["cron-model", PAUSE_EXAMPLE],
        WHEEL,
    ),
    "a paused, replaced or cancelled cron's pending firing is still delivered": (
        everywhere(withdraw_firing, lambda shard, entry, written, result: None),
        ["cron-model", PAUSE_EXAMPLE],
        WHEEL,
    ),
    "a replay's first firing takes the resume's id (a late withdrawal would deliver it twice with two ids)": (
        everywhere(replayed_firing_id, lambda paused_activation, first_ms: None),
        ["cron-model", PAUSE_EXAMPLE],
        WHEEL,
    ),
    "a firing id is reused (no instant in it)": (
        everywhere(firing_id, lambda activation, due_ms: activation),
        ["cron-model", FIRINGS_EXAMPLE],
        WHEEL,
    ),
    "the bounds of a cron are ignored": ([(cron, "first_firing", _first_firing_without_bounds)], ["cron-model"], WHEEL),
    "a cron's next firing is never filed": (
        [(ShardTransaction, "advance_crons", _no_next_firings)],
        ["cron-model", FIRINGS_EXAMPLE],
        WHEEL,
    ),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_model_test_finds_each_broken_rule(mutant, monkeypatch):
    """With one rule broken, the property test (same generator, at most the same number of examples,
    no shrinking) and the named examples fail, on each layout the rule belongs to."""
    patches, caught_by, engine_classes = MUTANTS[mutant]
    for owner, name, replacement in patches:
        monkeypatch.setattr(owner, name, replacement)

    for engine_class in engine_classes:

        @settings(
            max_examples=PROPERTY_EXAMPLES,
            phases=[Phase.generate],
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(script=scripts)
        def model_test(script):
            check_script(script, engine_class)  # noqa: B023 - run within this iteration

        @settings(
            max_examples=CRON_PROPERTY_EXAMPLES,
            phases=[Phase.generate],
            derandomize=True,
            database=None,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(script=cron_scripts)
        def cron_model_test(script):
            check_script(script, engine_class)  # noqa: B023 - run within this iteration

        for test in caught_by:
            with pytest.raises(AssertionError):
                if test == "model":
                    model_test()
                elif test == "cron-model":
                    cron_model_test()
                else:
                    globals()[test](engine_class(partitions=1))


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
        [],
        Counter({Outcome.SCHEDULED: 1, Outcome.CANCELLED: 1}),
    )
    assert engine.batch(60, [(sid("b"), due_now), (sid("b"), due_now)]) == (
        [sched(10)],
        Counter({Outcome.SCHEDULED: 1, Outcome.REPLACE_NOOP: 1}),
    )


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


@pytest.mark.parametrize(
    "other",
    [
        sched(100, headers=(("h", b"2"),), version="t-0-1"),
        sched(100, key=b"other", version="t-0-1"),
        sched(100, key=None, version="t-0-1"),
        sched(100, value=None, version="t-0-1"),
        sched(100, topic="elsewhere", version="t-0-1"),
        sched(101, version="t-0-1"),
        dataclasses.replace(sched(100, version="t-0-1"), partition=0),
        dataclasses.replace(sched(100, version="t-0-1"), partition_key=b""),
        dataclasses.replace(sched(100, version="t-0-1"), write_back=WriteBack("requests", 0, None, ())),
        dataclasses.replace(sched(100, version="t-0-1"), history=True),
    ],
    ids=[
        "headers",
        "key",
        "null-key",
        "null-value",
        "topic",
        "due",
        "partition",
        "empty-partition-key",
        "write-back",
        "history",
    ],
)
def test_replace_that_differs_in_any_field_is_not_a_noop(engine, other):
    engine.batch(0, [(sid("a"), Request(Action.ADD, sched(100)))])
    _, counts = engine.batch(1, [(sid("a"), Request(Action.REPLACE, other))])
    assert counts == Counter({Outcome.REPLACED: 1})
    assert engine.batch(101, [])[0] == [other]


def written_back(schedule: Schedule, offset: int, key: bytes | None = b"a") -> Schedule:
    """The schedule as a write-back dialect's request at ``offset`` makes it: its write-back names that offset."""
    back = WriteBack("requests", 0, key, ((SOURCE_OFFSET, str(offset).encode()),))
    return dataclasses.replace(schedule, write_back=back)


def complete(delivery_id: str | None) -> Request:
    return Request(Action.COMPLETE, None, delivery_id)


def test_write_back_of_the_delivered_version_after_a_resend_is_a_noop(engine):
    """The usual order in a write-back dialect: a version is delivered, the app sends the schedule again
    (a new version), then the first version's write-back is read back. It names a version no longer
    pending: nothing changes, and the re-send is delivered."""
    a, b = sid("a"), sid("b")
    v1 = written_back(sched(10_100, version="requests-0-1"), 1)
    v2 = written_back(sched(10_700, version="requests-0-2"), 2)  # the re-send: a new version (a new offset)
    engine.batch(10_000, [(a, Request(Action.ADD, v1))])
    assert engine.batch(10_100, [])[0] == [v1]
    assert engine.batch(10_150, [(a, Request(Action.ADD, v2))]) == ([], Counter({Outcome.SCHEDULED: 1}))
    assert engine.batch(10_200, [(a, complete("requests-0-1"))]) == ([], Counter({Outcome.COMPLETE_NOOP: 1}))
    assert engine.batch(10_700, [])[0] == [v2]
    assert engine.batch(10_800, [(a, complete("requests-0-2"))]) == ([], Counter({Outcome.COMPLETE_NOOP: 1}))
    # The re-send and the write-back of the version before it in one batch, the re-send due at once.
    w1 = written_back(sched(11_000, version="requests-0-3"), 3, b"b")
    w2 = written_back(sched(11_000, version="requests-0-4"), 4, b"b")
    engine.batch(10_900, [(b, Request(Action.ADD, w1))])
    assert engine.batch(11_000, [])[0] == [w1]
    assert engine.batch(11_001, [(b, Request(Action.ADD, w2)), (b, complete("requests-0-3"))]) == (
        [w2],
        Counter({Outcome.SCHEDULED: 1, Outcome.COMPLETE_NOOP: 1}),
    )


def test_write_back_read_back_with_its_schedule_completes_it(engine):
    """A rebuild (or a take-over) reads a delivered request and its write-back in one batch: the version
    is completed, never delivered again. An overdue one without a write-back is delivered."""
    a, b, c = sid("a"), sid("b"), sid("c")
    va = written_back(sched(5_000, b"a", "requests-0-1"), 1)
    vb = written_back(sched(5_500, b"b", "requests-0-2"), 2, b"b")
    vc = written_back(sched(25_000, b"c", "requests-0-3"), 3, b"c")
    delivered, counts = engine.batch(
        20_000,
        [
            (a, Request(Action.ADD, va)),
            (b, Request(Action.ADD, vb)),
            (c, Request(Action.ADD, vc)),
            (a, complete("requests-0-1")),
            (c, complete("requests-0-3")),
        ],
    )
    assert delivered == [vb] and counts == Counter({Outcome.SCHEDULED: 3, Outcome.COMPLETED: 2})
    assert engine.batch(30_000, [])[0] == []
    assert engine.batch(30_001, [(a, Request(Action.CANCEL, None))])[1] == Counter({Outcome.CANCEL_NOOP: 1})


def test_a_write_back_naming_no_version_completes_whatever_is_pending(engine):
    """A COMPLETE naming no version (as a write-back of the scheduler being replaced, without
    x-scheduler-source-offset, may be read) completes the id's pending version, whichever it is."""
    a = sid("a")
    engine.batch(0, [(a, Request(Action.ADD, sched(10_000, version="requests-0-1")))])
    assert engine.batch(1, [(a, Request(Action.REPLACE, sched(10_000, b"new", "requests-0-2")))])[1] == Counter(
        {Outcome.REPLACED: 1}
    )
    assert engine.batch(2, [(a, complete(None))]) == ([], Counter({Outcome.COMPLETED: 1}))
    assert engine.batch(3, [(a, complete(None)), (sid("b"), complete(None))]) == (
        [],
        Counter({Outcome.COMPLETE_NOOP: 2}),
    )
    assert engine.batch(10_000, [])[0] == []
    # Latest request wins within a batch: a version, completed, then another, due now.
    again = sched(15_000, b"again", "requests-0-5")
    assert engine.batch(
        20_000,
        [
            (a, Request(Action.ADD, sched(15_000, version="requests-0-4"))),
            (a, complete(None)),
            (a, Request(Action.ADD, again)),
        ],
    ) == ([again], Counter({Outcome.SCHEDULED: 2, Outcome.COMPLETED: 1}))


def test_a_write_back_naming_an_old_version_never_cancels_the_newer_one(engine):
    a, b = sid("a"), sid("b")
    v1 = written_back(sched(10_500, version="requests-0-1"), 1)
    v2 = written_back(sched(10_500, version="requests-0-2"), 2)  # re-sent while pending: a new version
    engine.batch(10_000, [(a, Request(Action.ADD, v1))])
    assert engine.batch(10_001, [(a, Request(Action.REPLACE, v2))]) == ([], Counter({Outcome.REPLACED: 1}))
    assert engine.batch(10_002, [(a, complete("requests-0-1")), (a, complete("elsewhere-0-2"))]) == (
        [],
        Counter({Outcome.COMPLETE_NOOP: 2}),
    )
    assert engine.batch(10_500, [(a, complete("requests-0-1"))]) == ([v2], Counter({Outcome.COMPLETE_NOOP: 1}))
    # All in one batch, due now: the newer version is delivered.
    w1 = written_back(sched(10_400, version="requests-0-7"), 7, b"b")
    w2 = written_back(sched(10_400, version="requests-0-8"), 8, b"b")
    assert engine.batch(
        10_501, [(b, Request(Action.ADD, w1)), (b, Request(Action.REPLACE, w2)), (b, complete("requests-0-7"))]
    ) == ([w2], Counter({Outcome.SCHEDULED: 1, Outcome.REPLACED: 1, Outcome.COMPLETE_NOOP: 1}))


def test_partition_key_partition_write_back_and_history_come_out_of_both_layouts(engine):
    """Delivered at once, from a bucket's first fire, from what a partial fire left, and sent without id:
    every field a dialect adds comes out as it went in, next to native schedules in the same bucket."""
    full = Schedule(
        10_900,
        "out",
        b"k",
        b"v",
        (("h", b"1"),),
        "requests-0-1",
        partition=2,
        partition_key=b"\x00pk",
        write_back=WriteBack("requests", 1, b"\xff\x00", ((SOURCE_OFFSET, b"1"), ("x", None))),
        history=True,
    )
    keyed = dataclasses.replace(full, delivery_id="requests-0-2", partition=None, write_back=None, history=False)
    by_partition = dataclasses.replace(
        full, delivery_id="requests-0-3", partition=0, partition_key=None, write_back=WriteBack("requests", 0, None, ())
    )
    early = dataclasses.replace(full, delivery_id="requests-0-4", due_ms=10_100)
    anonymous = dataclasses.replace(full, delivery_id="requests-0-5", due_ms=10_950)
    now_due = dataclasses.replace(full, delivery_id="requests-0-6", due_ms=9_000)
    native = sched(10_200, version="requests-0-7")
    delivered, counts = engine.batch(
        10_000,
        [
            (sid("full"), Request(Action.ADD, full)),
            (sid("keyed"), Request(Action.ADD, keyed)),
            (sid("partition"), Request(Action.ADD, by_partition)),
            (sid("early"), Request(Action.ADD, early)),
            (anon(5), Request(Action.ADD, anonymous)),
            (sid("now"), Request(Action.ADD, now_due)),
            (sid("native"), Request(Action.ADD, native)),
        ],
    )
    assert delivered == [now_due] and counts == Counter({Outcome.SCHEDULED: 7})
    assert sorted(engine.batch(10_500, [])[0], key=lambda s: s.delivery_id) == [early, native]  # a partial fire
    assert sorted(engine.batch(11_000, [])[0], key=lambda s: s.delivery_id) == [full, keyed, by_partition, anonymous]
    # Identical again (same write-back too): a no-op; anything else, a new version.
    engine.batch(11_001, [(sid("full"), Request(Action.ADD, dataclasses.replace(full, due_ms=12_000)))])
    assert engine.batch(
        11_002,
        [(sid("full"), Request(Action.ADD, dataclasses.replace(full, due_ms=12_000, delivery_id="requests-0-9")))],
    )[1] == Counter({Outcome.REPLACE_NOOP: 1})
    assert engine.batch(12_000, [])[0] == [dataclasses.replace(full, due_ms=12_000)]


def test_replace_that_differs_only_in_what_a_dialect_adds_is_not_a_noop(engine):
    """Partition, partition key, write-back (any part of it: a re-send's names a new offset) and history flag
    are part of a version: a request differing only there replaces it. Only the identical one is a no-op."""
    base = written_back(dataclasses.replace(sched(10_500), partition=1, partition_key=b"pk"), 1)
    back = base.write_back
    others = {
        "no partition": dataclasses.replace(base, partition=None),
        "another partition": dataclasses.replace(base, partition=2),
        "no partition key": dataclasses.replace(base, partition_key=None),
        "another partition key": dataclasses.replace(base, partition_key=b"pk2"),
        "no write-back": dataclasses.replace(base, write_back=None),
        "write-back of a re-send": written_back(base, 2),
        "write-back to another partition": dataclasses.replace(base, write_back=dataclasses.replace(back, partition=3)),
        "write-back without key": dataclasses.replace(base, write_back=dataclasses.replace(back, key=None)),
        "history": dataclasses.replace(base, history=True),
    }
    requests = [
        (sid(name), Request(Action.ADD, dataclasses.replace(base, delivery_id=f"requests-{i}-1")))
        for i, name in enumerate(others)
    ]
    same = dataclasses.replace(base, delivery_id="same-0-1")
    engine.batch(10_000, requests + [(sid("same"), Request(Action.ADD, same))])
    replaces = [
        (sid(name), Request(Action.REPLACE, dataclasses.replace(other, delivery_id=f"requests-{i}-2")))
        for i, (name, other) in enumerate(others.items())
    ]
    _, counts = engine.batch(
        10_001, replaces + [(sid("same"), Request(Action.REPLACE, dataclasses.replace(base, delivery_id="same-0-2")))]
    )
    assert counts == Counter({Outcome.REPLACED: len(others), Outcome.REPLACE_NOOP: 1})
    delivered = sorted(engine.batch(10_500, [])[0], key=lambda s: s.delivery_id)
    assert delivered == [r.schedule for _, r in replaces] + [same]


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
    engine.batch(
        0,
        [
            (sid("a"), Request(Action.ADD, sched(10_100, version="t-0-1"))),
            (sid("b"), Request(Action.ADD, sched(10_900, version="t-0-2"))),
        ],
    )
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
    engine.batch(
        0,
        [
            (sid("early"), Request(Action.ADD, sched(9_100, version="t-0-1"))),
            (sid("late"), Request(Action.ADD, sched(9_900, version="t-0-2"))),
        ],
    )
    assert engine.batch(9_500, [])[0] == [sched(9_100, version="t-0-1")]
    assert engine.batch(9_000, [(sid("b"), Request(Action.ADD, sched(9_300, b"old", "t-0-3")))])[0] == []
    _, counts = engine.batch(9_001, [(sid("b"), Request(Action.REPLACE, sched(9_300, b"new", "t-0-4")))])
    assert counts == Counter({Outcome.REPLACED: 1})
    assert sorted(s.delivery_id for s in engine.batch(10_000, [])[0]) == ["t-0-2", "t-0-4"]


def test_lookahead_lowered_at_restart_loses_nothing():
    """Defect 1: timers set 1.5 s early, then the lookahead goes to 0: everything still fires on time."""
    for engine_class in ENGINES:
        engine = engine_class(lookahead_ms=1500)
        engine.batch(
            0, [(sid(f"s{i}"), Request(Action.ADD, sched(20_000 + 100 * i, version=f"t-0-{i}"))) for i in range(5)]
        )
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


def test_log_order_of_the_wheel_keeps_each_partition_in_offset_order_and_interleaves_by_time():
    frame = pd.DataFrame(
        [
            ("t", 0, 5, 50),
            ("t", 1, 1, 20),
            ("t", 0, 4, 60),
            ("t", 1, 2, 70),
            ("u", 0, 9, 10),
            ("t", 0, 6, 55),
        ],
        columns=["src_topic", "src_partition", "src_offset", "src_ts_ms"],
    )
    ordered = [tuple(r) for r in log_order(frame)[["src_topic", "src_partition", "src_offset"]].itertuples(index=False)]
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


# ---------------------------------------------------------------- recurring schedules and expiry, examples

EVERY_5S = Cron("* * * * * */5")


def cron_add(
    definition: Cron = EVERY_5S,
    offset: int = 1,
    value: bytes = b"tick",
    max_lateness: int | None = None,
    topic: str = "out",
) -> Request:
    version = f"requests-0-{offset}"
    return Request(
        Action.CRON_ADD,
        Schedule(0, topic, b"k", value, (("h", b"1"),), version, max_lateness_ms=max_lateness, cron=definition),
        raw_headers=(("x-scheduler-action", b"CRON_ADD"), ("h", b"1")),
        activation=version,
    )


def cron_request(action: Action, offset: int) -> Request:
    return Request(action, None, activation=f"requests-0-{offset}")


def firings_of(delivered) -> list[tuple[int, str]]:
    return [(s.due_ms, s.delivery_id) for s in delivered if s.cron is not None]


def test_a_cron_fires_at_each_instant_with_a_delivery_id_of_its_own(engine):
    """Registered at 10.2 s, every 5 s: 15 s, 20 s, 25 s, each with the id "<request>@<instant>"; never early."""
    a = cron_sid("a")
    delivered, counts = engine.batch(10_200, [(a, cron_add())])
    assert delivered == [] and counts == Counter({Outcome.CRON_ADDED: 1})
    assert engine.batch(14_999, [])[0] == []
    assert firings_of(engine.batch(15_000, [])[0]) == [(15_000, "requests-0-1@15000")]
    assert firings_of(engine.batch(19_000, [])[0]) == []
    assert firings_of(engine.batch(20_001, [])[0]) == [(20_000, "requests-0-1@20000")]
    assert firings_of(engine.batch(25_000, [])[0]) == [(25_000, "requests-0-1@25000")]
    assert engine.batch(25_001, [(a, cron_request(Action.CRON_CANCEL, 2))])[1] == Counter({Outcome.CRON_CANCELLED: 1})
    assert engine.batch(40_000, [])[0] == []


def test_a_pause_withdraws_the_held_firing_and_a_resume_replays_or_skips(engine):
    for policy in ("replay", "skip"):
        engine = type(engine)(lookahead_ms=1500, partitions=1)
        a = cron_sid("a")
        engine.batch(10_200, [(a, cron_add(Cron("* * * * * */5", policy=policy)))])
        engine.batch(13_800, [])
        assert [s.due_ms for s in engine.prepared] == [15_000]  # held by the timed writer
        delivered, counts = engine.batch(14_000, [(a, cron_request(Action.CRON_PAUSE, 2))])
        assert counts == Counter({Outcome.CRON_PAUSED: 1})
        assert engine.held == {} and engine.batch(15_000, [])[0] == []  # withdrawn
        assert engine.batch(27_000, [(a, cron_request(Action.CRON_PAUSE, 3))])[1] == Counter(
            {Outcome.CRON_PAUSE_NOOP: 1}
        )
        delivered, counts = engine.batch(27_100, [(a, cron_request(Action.CRON_RESUME, 4))])
        assert counts == Counter({Outcome.CRON_RESUMED: 1})
        if policy == "replay":  # 15, 20 and 25 s, missed while paused, at once and in order; the one the pause
            # withdrew keeps its id (had the writer written it before the withdrawal, a duplicate with the same id)
            assert firings_of(delivered) == [
                (15_000, "requests-0-1@15000"),
                (20_000, "requests-0-4@20000"),
                (25_000, "requests-0-4@25000"),
            ]
        else:
            assert firings_of(delivered) == []
        assert firings_of(engine.batch(30_000, [])[0]) == [(30_000, "requests-0-4@30000")]


def test_firings_missed_while_the_job_was_down_are_replayed_in_order_or_skipped(engine):
    for policy in ("replay", "skip"):
        engine = type(engine)(partitions=1)
        a = cron_sid("a")
        engine.batch(10_200, [(a, cron_add(Cron("* * * * * */5", policy=policy)))])
        assert firings_of(engine.batch(15_000, [])[0]) == [(15_000, "requests-0-1@15000")]
        engine = engine.restart(lookahead_ms=0, partitions=1)  # down from 15 s to 31 s
        delivered = engine.batch(31_000, [])[0]
        if policy == "replay":
            assert [t for t, _ in firings_of(delivered)] == [20_000, 25_000, 30_000]
        else:
            assert firings_of(delivered) == [] and engine.skipped["skipped"] == 1
        assert firings_of(engine.batch(35_000, [])[0]) == [(35_000, "requests-0-1@35000")]
        # Late because of a slow batch, not because the job was down: delivered, whatever the policy.
        assert firings_of(engine.batch(42_000, [])[0]) == [(40_000, "requests-0-1@40000")]


def test_a_skip_cron_skips_what_was_due_before_the_start_in_a_batch_run_again_with_an_earlier_time(engine):
    """A batch the job before left unfinished is run again with that job's batch time (Spark keeps it in the offset
    log): a skip cron's firing due after that time but before this job started was missed all the same, and so were
    the ones after it until the start (an integration run on a loaded machine delivered them as expired)."""
    engine = type(engine)(lookahead_ms=3000, partitions=1)
    a = cron_sid("a")
    engine.batch(10_200, [(a, cron_add(Cron("* * * * * */5", policy="skip")))])  # 15 s, prepared from 12 s on
    assert engine.batch(11_000, [])[0] == [] and engine.prepared == []
    engine = engine.restart(lookahead_ms=3000, partitions=1)
    engine.started = 36_000  # this job started at 36 s; its first batch runs the old job's unfinished one, at 12.5 s
    assert engine.batch(12_500, [])[0] == [] and engine.prepared == [] and engine.skipped["skipped"] == 1
    delivered = engine.batch(37_000, [])[0]
    assert delivered == [] and engine.expired == [], "20-35 s were due while no job ran"
    assert firings_of(engine.batch(40_000, [])[0]) == [(40_000, "requests-0-1@40000")]


def test_a_skip_crons_first_firing_due_before_the_start_is_missed_when_a_batch_run_again_prepares_it():
    """The model agrees with the engine: a cron added in a batch run again with an earlier time (13.7 s, this job
    started at 15.2 s) whose first firing (15 s) the batch prepares is missed then (found by the property test in
    CI: the model counted it missed only once due by a batch's time)."""
    cron_add_op = Op(
        "CRON_ADD", b"a", topic="out", key=None, value=None, cron=CronOp("* * * * * */5", None, "skip", None, None)
    )
    check_script(
        (0, 1, [([], 5200, Restart(1500, 1)), ([], -1500, None), ([cron_add_op], 10_000, None), ([], 1, None)]),
        WheelEngine,
    )


def test_a_delivery_later_than_its_max_lateness_is_expired(engine):
    one_shot = dataclasses.replace(sched(11_000), max_lateness_ms=1000)
    engine.batch(
        10_000, [(sid("a"), Request(Action.ADD, one_shot)), (cron_sid("a"), cron_add(max_lateness=2000, offset=2))]
    )
    delivered, _ = engine.batch(12_500, [])  # 1.5 s late: more than 1 s
    assert delivered == [] and engine.expired == [one_shot]
    delivered, _ = engine.batch(17_000, [])  # 2 s late: not more than 2 s
    assert firings_of(delivered) == [(15_000, "requests-0-2@15000")] and engine.expired == []
    delivered, _ = engine.batch(22_001, [])
    assert delivered == [] and [s.delivery_id for s in engine.expired] == ["requests-0-2@20000"]


def test_a_replace_that_changes_only_the_max_lateness_is_a_new_version(engine):
    """Two versions that differ in their max lateness alone are not identical: the replace takes effect, and the
    new limit decides whether a late delivery expires."""
    strict = dataclasses.replace(sched(20_000), max_lateness_ms=1000)
    lenient = dataclasses.replace(sched(20_000, version="t-0-1"), max_lateness_ms=5000)
    assert engine.batch(10_000, [(sid("a"), Request(Action.ADD, strict))])[1] == Counter({Outcome.SCHEDULED: 1})
    assert engine.batch(10_001, [(sid("a"), Request(Action.REPLACE, lenient))])[1] == Counter({Outcome.REPLACED: 1})
    delivered, _ = engine.batch(22_000, [])  # 2 s late: within the new 5 s
    assert delivered == [lenient] and engine.expired == []


def test_cron_and_one_shot_ids_are_separate(engine):
    engine.batch(10_000, [(cron_sid("a"), cron_add()), (sid("a"), Request(Action.ADD, sched(12_000)))])
    assert engine.batch(
        10_001, [(sid("b"), Request(Action.CANCEL, None)), (cron_sid("b"), cron_request(Action.CRON_CANCEL, 3))]
    )[1] == Counter({Outcome.CANCEL_NOOP: 1, Outcome.CRON_CANCEL_NOOP: 1})
    assert engine.batch(10_002, [(sid("a"), Request(Action.CANCEL, None))])[1] == Counter({Outcome.CANCELLED: 1})
    assert firings_of(engine.batch(15_000, [])[0]) == [(15_000, "requests-0-1@15000")]
    assert engine.batch(
        15_001, [(cron_sid("a"), cron_request(Action.CRON_CANCEL, 4)), (sid("a"), Request(Action.CANCEL, None))]
    )[1] == Counter({Outcome.CRON_CANCELLED: 1, Outcome.CANCEL_NOOP: 1})


def test_bounds_an_identical_add_and_a_rejected_one(engine):
    a, b = cron_sid("a"), cron_sid("b")
    bounded = Cron("* * * * * */5", start_ms=17_000, end_ms=25_000)
    _, counts = engine.batch(10_000, [(a, cron_add(bounded)), (b, cron_add(Cron("* * * * * */2"), offset=2))])
    assert counts == Counter({Outcome.CRON_ADDED: 1, Outcome.REJECTED: 1})
    assert "more often than the minimum interval" in engine.rejected[0]["reason"][0]
    assert engine.batch(10_001, [(a, cron_add(bounded, offset=3))])[1] == Counter({Outcome.CRON_REPLACE_NOOP: 1})
    assert firings_of(engine.batch(16_000, [])[0]) == []  # not before its start
    assert [t for t, _ in firings_of(engine.batch(30_000, [])[0])] == [20_000, 25_000]  # nor after its end
    assert engine.stores[0].index_entries() == {}  # past its end: gone
    assert engine.batch(30_001, [(a, cron_request(Action.CRON_PAUSE, 4))])[1] == Counter({Outcome.CRON_PAUSE_NOOP: 1})
