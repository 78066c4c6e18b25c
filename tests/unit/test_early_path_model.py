"""The early path against the state's rules, over generated scripts: requests of one id (ADDs of one of two
contents, CANCELs) arrive in two partitions, some before the watcher started; the watcher reads them as they arrive
and batches apply them and hand over what the state holds, in any interleaving, until the version's due time
passes. What is written must be the version the state holds after every request read by then (by the watcher or a
batch), once, under the state's delivery id: the latest request in log order wins, an ADD identical to the pending
version is a no-op that keeps its id, a CANCEL leaves nothing. The mutants at the end break one rule of the early
path each; this test must catch them."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from kafka_scheduler.delivery_ids import delivery_id
from kafka_scheduler.engine.driver import early_book, early_cancels, timed_writer
from kafka_scheduler.engine.driver.early_cancels import Arrival
from kafka_scheduler.engine.driver.timed_writer import TimedWriter
from kafka_scheduler.protocol import DELIVERY_ID

from .test_early_path import TOPIC, handed, request, sid
from .test_timed_writer import FakeProducer

DUE_AFTER_MS = 300  # every version is due this long after an example starts; its steps take a few milliseconds
EXAMPLES = 100


@dataclass(frozen=True)
class Sent:
    """A request as it arrived: its place in the log and what it asks."""

    partition: int
    offset: int
    stamp: int
    value: bytes | None  # None: a CANCEL

    @property
    def delivery_id(self) -> str:
        return delivery_id(TOPIC, self.partition, self.offset)


def arrived(script: list[tuple[int, bytes | None]]) -> list[Sent]:
    """Offsets per partition and the broker's stamps, in the order the requests arrive."""
    offsets = {0: 100, 1: 200}
    log = []
    for n, (partition, value) in enumerate(script):
        log.append(Sent(partition, offsets[partition], 1_000 + 10 * n, value))
        offsets[partition] += 1
    return log


def state_after(log: list[Sent]) -> tuple[bytes, str] | None:
    """The state's pending version after applying ``log`` in order: (value, delivery id), or None."""
    version = None
    for sent in log:
        if sent.value is None:
            version = None
        elif version is None or version[0] != sent.value:
            version = (sent.value, sent.delivery_id)
    return version


def run(log: list[Sent], before: int, steps: list[tuple[str, int]], due_at: int) -> tuple[list, tuple | None]:
    """Drives a writer: a batch applied the first ``before`` requests (the state's, not handed over: not due within
    its lookahead yet) before the watcher started; then ``steps`` ("read", n: the watcher reads n more as they
    arrive; "batch", n: a batch applies n more, hands over what the state holds, and commits), the due time passing
    after the first ``due_at`` of them; then a batch applies what was read. Returns what was written, and the
    version the state holds after the requests read by the due time (read by the watcher or a batch)."""
    producer = FakeProducer()
    writer = TimedWriter("unused", producer=producer)
    try:
        due = int(time.time() * 1000) + DUE_AFTER_MS
        by_place = {(s.partition, s.offset): s for s in log}

        def early(arrival: Arrival, _timestamp, *_fields):
            sent = by_place[arrival.partition, arrival.offset]
            return request("a", sent.offset, due, sent.value, sent.partition, sent.stamp)

        read = applied = 0
        handed_over: str | None = None

        def watcher_reads(n: int) -> None:
            nonlocal read
            for sent in log[read : read + n]:
                cancel = sid("a") if sent.value is None else None
                fields = None if sent.value is None else (b"k", sent.value, [("x-scheduler-request-id", b"a")])
                writer.read_early([(TOPIC, sent.partition, sent.offset, sent.stamp, cancel, fields)], early)
            read = min(len(log), read + n)

        def batch_applies(n: int, hands_over: bool = True, frontier: int | None = None) -> None:
            nonlocal applied, handed_over
            applied = min(len(log), applied + n)
            version = state_after(log[:applied])
            if hands_over and (version is None or version[1] != handed_over):
                if handed_over is not None:
                    writer.withdraw([handed_over])
                if version is not None:
                    value, made = version
                    sent = next(s for s in log if s.delivery_id == made)
                    writer.hold([handed("a", sent.offset, due, value, sent.partition)])
                handed_over = None if version is None else version[1]
            committed = {p: max((s.offset + 1 for s in log[:applied] if s.partition == p), default=0) for p in (0, 1)}
            writer.forget_cancels({TOPIC: committed})
            # Its time plus the lookahead: before the due time (the early versions wait) until the batch at the due
            # time, which hands over what the state holds due then, as any batch does.
            writer.advance_frontier(min(int(time.time() * 1000), due - 1) if frontier is None else frontier)

        batch_applies(before, hands_over=False)
        read = before  # the watcher starts from the end
        for action, n in steps[:due_at]:
            (watcher_reads if action == "read" else batch_applies)(n)
        known = max(read, applied)
        # A batch's deliveries go out at their due time whatever the frontier: the steps must all come before it.
        assume(time.time() * 1000 < due - 100)
        batch_applies(0, frontier=due + 1_000)
        while time.time() * 1000 <= due:
            time.sleep(0.01)
        assert writer.wait_written(int(time.time() * 1000), timeout=5)
        batch_applies(known - applied)  # what was read by the due time, applied late: written now if still pending
        assert writer.wait_written(int(time.time() * 1000), timeout=5)
        deadline = time.monotonic() + 0.1  # anything more would be written by now: look for it
        while time.monotonic() < deadline:
            time.sleep(0.01)
        written = [
            (value, dict(headers)[DELIVERY_ID].decode()) for value, headers in zip(producer.values, producer.headers)
        ]
        return written, state_after(log[:known])
    finally:
        writer.close()


scripts = st.lists(st.tuples(st.integers(0, 1), st.sampled_from([b"x", b"y", None])), min_size=1, max_size=4)
step_lists = st.lists(st.tuples(st.sampled_from(["read", "batch"]), st.integers(1, 3)), max_size=6)


@st.composite
def cases(draw):
    script = draw(scripts)
    steps = draw(step_lists)
    return script, draw(st.integers(0, len(script))), steps, draw(st.integers(0, len(steps)))


def check(case) -> None:
    script, before, steps, due_at = case
    log = arrived(script)
    written, expected = run(log, before, steps, due_at)
    assert written == ([] if expected is None else [expected]), f"log {log}, before {before}, steps {steps}, {due_at}"


PROPERTY = settings(
    max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY
@given(cases())
def test_what_is_written_is_what_the_state_holds_by_the_due_time_once_under_its_id(case):
    check(case)


# Each breaks one rule of the early path; the generated scripts must find it.
MUTANTS = {
    # An ADD identical to its pending version is written early under its own id (a version under a second id).
    "a no-op ADD is held as a new version": (
        timed_writer.TimedWriter,
        "_superseded_early",
        lambda self, held: self._book.first_after(held.sid, held.delivery_id, self._arrivals) is not None,
    ),
    # A CANCEL from another partition is ordered by offsets, not the broker's stamps (it loses to an older version).
    "requests ordered by offset across partitions": (
        early_cancels,
        "made_before",
        lambda delivery_id_, arrival, times=None: int(delivery_id_.rsplit("-", 1)[1]) < arrival.offset,
    ),
}


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_the_model_test_finds_each_broken_early_rule(mutant, monkeypatch):
    owner, name, replacement = MUTANTS[mutant]
    monkeypatch.setattr(owner, name, replacement)
    if owner is early_cancels:  # imported by name where it is used
        for user in (early_book, timed_writer):
            monkeypatch.setattr(user, name, replacement)
    finds = settings(PROPERTY, phases=[Phase.generate])(given(cases())(check))  # the first failure is enough
    with pytest.raises(AssertionError):
        finds()
