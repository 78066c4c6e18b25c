"""Hostile input: no request record, whatever its bytes, may stop the job.

A request id is bytes: any non-empty byte sequence (invalid UTF-8 included) is a valid id that can
be scheduled, replaced and cancelled, and two ids that differ in any byte are different ids. Any
other byte sequence in a key, value or header value ends as a rejection (on
`<app-id>-schedule-rejections`, with the reason and source headers) or as a valid request.

Each test runs its own scheduler (a poison pill kills the one it is sent to, and a restart on the
same topic would read it again), on both state layouts.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass

import pytest

from .support import Record, at, native, wait_until

WAIT = 120  # seconds to wait for a delivery before failing

ACTION, TO, AT, ID = (
    "x-scheduler-action",
    "x-scheduler-deliver-to",
    "x-scheduler-deliver-at",
    "x-scheduler-request-id",
)
ACTIONS = (b"ADD", b"REPLACE", b"CANCEL")

INVALID_UTF8 = [
    b"\xff",
    b"\xfe\xff",
    b"\x80",
    b"\xc3\x28",
    b"\xa0\xa1",
    b"\xe2\x28\xa1",
    b"\xf0\x28\x8c\xbc",
    b"\xed\xa0\x80",  # a UTF-16 surrogate
    b"\xc0\xaf",  # overlong '/'
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"abc\xff",
    b"\xe2\x82",
]  # truncated sequence


@pytest.fixture(params=["wheel"])
def scheduler(request, scheduler_factory):
    process = scheduler_factory(
        app_id=f"hostile-{request.param}-{uuid.uuid4().hex[:6]}", extra_args=("--state-layout", request.param)
    )
    process.start()
    wait_until(lambda: "first batch done" in process.log(), 120, "the first batch", guard=process.assert_running)
    yield process
    if process.process.poll() is None:
        assert process.stop() == 0, process.log()[-3000:]


def garbage(rng: random.Random) -> bytes | None:
    """A header value no field accepts as it is (None: a header with a null value)."""
    kind = rng.randrange(9)
    if kind == 0:
        return b""
    if kind == 1:
        return rng.randbytes(rng.randint(1, 16))
    if kind == 2:
        return rng.choice(INVALID_UTF8) + rng.randbytes(rng.randint(0, 4))
    if kind == 3:
        return rng.choice([b"\x00" * rng.randint(1, 8), b"a\x00b", b"ADD\x00", b"\x00CANCEL"])
    if kind == 4:
        return rng.randbytes(rng.randint(9_000, 11_000))
    if kind == 5:
        return None
    if kind == 6:
        return rng.choice(
            [
                b" ",
                b"\t",
                b"\xef\xbb\xbfADD",
                b"2030-01-01T00:00:00Z\xff",
                b"2030-01-01T00:00:00",
                b"t\xffopic",
                b"a b",
                b"..",
                b"\xff" * 300,
                "t\u00f6pic".encode(),
                b"POSTPONE",
            ]
        )
    if kind == 7:
        return bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 40)))
    return rng.choice(INVALID_UTF8) * rng.randint(1, 50)


def random_bytes(rng: random.Random) -> bytes | None:
    """A key or value."""
    kind = rng.randrange(6)
    if kind == 0:
        return None
    if kind == 1:
        return b""
    if kind == 2:
        return rng.randbytes(rng.randint(9_000, 11_000))
    if kind == 3:
        return rng.choice(INVALID_UTF8) + b"\x00" + rng.randbytes(rng.randint(0, 8))
    return rng.randbytes(rng.randint(1, 64))


def spell(rng: random.Random, name: str) -> str:
    """Header names match case-insensitively."""
    return rng.choice([name, name, name.upper(), name.title()])


@dataclass
class Hostile:
    headers: list
    key: bytes | None
    value: bytes | None
    expect: str  # "rejected", "delivered", "nothing" (a valid CANCEL), "either" (rejected or delivered, once)
    why: str


def hostile_request(rng: random.Random, n: int, topic: str) -> Hostile:
    """One record with random bytes in every native header, and what must become of it."""
    tag = b"#%d" % n  # keeps ids unique: no hostile record may act on another's schedule
    modes = {
        name: rng.choices(["absent", "valid", "garbage", "duplicate"], weights)[0]
        for name, weights in ((ACTION, [3, 4, 2, 1]), (TO, [1, 5, 3, 1]), (AT, [1, 5, 3, 1]), (ID, [3, 4, 2, 1]))
    }

    def valid(name: str) -> bytes:
        if name == ACTION:
            return rng.choice([b"ADD", b"add", b"Replace", b"REPLACE", b"cancel", b" CANCEL ", b"Add"])
        if name == TO:
            return topic.encode()
        if name == AT:
            return rng.choice(
                [
                    at(rng.uniform(-30, 3)),
                    at(rng.uniform(0, 3)).replace("Z", "+00:00"),
                    "2001-01-01T00:00:00.000000001Z",
                ]
            ).encode()
        # A valid id: text, or any non-empty bytes (invalid UTF-8, NUL bytes, ~10 kB).
        return rng.choice([b"id", rng.randbytes(8), rng.choice(INVALID_UTF8), b"\x00", rng.randbytes(10_000)]) + tag

    def bad(name: str) -> bytes | None:
        if name == ID:
            return rng.choice([None, b""])  # any other bytes are a valid id
        while True:
            value = garbage(rng)
            if name == ACTION and value is not None and value.strip(b" ").upper() in ACTIONS:
                continue
            if name == TO and value == topic.encode():
                continue
            return value

    headers, values = [], {}
    for name, mode in modes.items():
        if mode == "valid":
            values[name] = valid(name)
            headers.append((spell(rng, name), values[name]))
        elif mode == "garbage":
            values[name] = bad(name)
            headers.append((spell(rng, name), values[name]))
        elif mode == "duplicate":
            pair = rng.choice([(valid(name), bad(name)), (bad(name), valid(name)), (valid(name), valid(name))])
            headers += [(spell(rng, name), pair[0]), (spell(rng, name), pair[1])]
    for _ in range(rng.randrange(4)):
        name = rng.choice(["user", "", "trace-\u00fc", "x-scheduler-extra", "X-Scheduler-Delivery-Id"])
        headers.insert(rng.randrange(len(headers) + 1), (name, rng.choice([None, b"", rng.randbytes(12)])))

    why = " ".join(f"{name[12:]}={mode}" for name, mode in modes.items())
    expect = expectation(modes, values)
    return Hostile(headers, random_bytes(rng), random_bytes(rng), expect, why)


def expectation(modes: dict, values: dict) -> str:
    """What the native protocol says becomes of a request (README: the native protocol in brief)."""
    if "duplicate" in modes.values():
        return "rejected"
    action = values.get(ACTION)
    if action is not None and action.strip(b" ").upper() not in ACTIONS:
        return "rejected"  # unknown action
    action = b"ADD" if action is None else action.strip(b" ").upper()
    request_id = values.get(ID)
    if action in (b"REPLACE", b"CANCEL") and not request_id:
        return "rejected"  # missing (or empty) request id
    if action == b"CANCEL":
        return "nothing"  # a cancel of an id nothing was scheduled under
    if modes[TO] != "valid" or modes[AT] != "valid":
        # Garbage, null or no destination (an invalid, forbidden or missing topic) or due time.
        return "rejected"
    if request_id == b"":
        return "either"  # an ADD with an empty id: rejected today, anonymous would do too
    return "delivered"  # with a unique id, or none (absent or a null header value)


def source_offset(record: Record) -> int | None:
    values = record.header_values("x-scheduler-source-offset")
    return int(values[0]) if len(values) == 1 else None


def test_a_poison_pill_never_stops_the_job(kafka, scheduler):
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic("hostile-out")
    deliveries = kafka.reader(topic)
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    rng = random.Random(20261126)
    hostile = [hostile_request(rng, n, topic) for n in range(300)]
    mark = scheduler.mark()

    sent = kafka.produce_many(
        requests, [dict(key=h.key, value=h.value, headers=h.headers, partition=0) for h in hostile]
    )
    by_offset = {offset: h for h, (_, offset) in zip(hostile, sent)}
    # The valid request, due after everything above: once it is delivered, nothing more can come.
    [(_, final_offset)] = kafka.produce_many(
        requests, [dict(key=b"final", value=b"ok", partition=0, headers=native(topic, at(6), "final"))]
    )
    deliveries.wait_for(
        lambda r: r.key == b"final",
        timeout=WAIT,
        what="the valid request after the hostile ones",
        guard=scheduler.assert_running,
    )
    scheduler.assert_running()
    scheduler.mark()  # the batch that delivered it has committed: everything it wrote is readable
    delivered = [r for r in deliveries.read_to_end() if r.key != b"final"]
    rejected = [
        r for r in rejections.read_to_end() if r.header_values("x-scheduler-source-topic") == [requests.encode()]
    ]

    rejections_of = Counter(source_offset(r) for r in rejected)
    deliveries_of = Counter(int(r.header("x-scheduler-delivery-id").rsplit(b"-", 1)[1]) for r in delivered)
    wrong = []
    for offset, h in by_offset.items():
        got = (rejections_of[offset], deliveries_of[offset])
        wanted = {"rejected": [(1, 0)], "delivered": [(0, 1)], "nothing": [(0, 0)], "either": [(1, 0), (0, 1)]}
        if got not in wanted[h.expect]:
            wrong.append(
                f"offset {offset} ({h.why}): expected {h.expect}, got {got[0]} rejections and {got[1]} deliveries"
            )
    assert not wrong, f"{len(wrong)} of {len(hostile)} hostile records went wrong:\n" + "\n".join(wrong[:20])
    assert set(rejections_of) <= set(by_offset) and set(deliveries_of) <= set(by_offset)
    assert deliveries_of[final_offset] == 0 and rejections_of[final_offset] == 0

    expected = Counter(h.expect for h in hostile)
    garbage_destinations = sum(1 for h in hostile if "deliver-to=garbage" in h.why and h.expect == "rejected")
    assert expected["rejected"] >= 100 and expected["delivered"] >= 20 and garbage_destinations >= 50, (
        f"the generator lost its edge: {expected}, {garbage_destinations} with a garbage destination"
    )

    for record in rejected:
        h = by_offset[source_offset(record)]
        assert (record.key, record.value) == (h.key, h.value), f"rejection of {h.why} altered key or value"
        reasons = record.header_values("x-scheduler-rejection-reason")
        assert reasons and all(reasons), f"rejection of {h.why} without a reason"
        assert record.header("x-scheduler-source-partition") == b"0"
        if not any(b"does not exist" in reason for reason in reasons):
            assert record.headers[: len(h.headers)] == h.headers, f"rejection of {h.why} altered the headers"
    for record in delivered:
        h = by_offset[int(record.header("x-scheduler-delivery-id").rsplit(b"-", 1)[1])]
        assert (record.key, record.value) == (h.key, h.value), f"delivery of {h.why} altered key or value"
        kept = [(k, v) for k, v in h.headers if not k.lower().startswith("x-scheduler-")]
        assert record.headers[:-1] == kept and record.headers[-1][0] == "x-scheduler-delivery-id", h.why

    # One outcome per request, none lost: the hostile records and the valid one.
    outcomes = scheduler.outcomes_since(mark, len(hostile) + 1)
    assert sum(outcomes.values()) == len(hostile) + 1, outcomes
    assert outcomes["rejected"] == sum(
        1
        for r in rejected
        if not any(b"does not exist" in reason for reason in r.header_values("x-scheduler-rejection-reason"))
    ), outcomes


def test_binary_request_ids_are_valid_ids_and_are_never_collapsed(kafka, scheduler):
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic("binary-ids")
    reader = kafka.reader(topic)
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    mark = scheduler.mark()
    cancelled, replaced = b"\xff\xfe\x00\x80id", b"\x80\x81\xc3\x28bin\x00"
    twin_a, twin_b = b"twin\xff", b"twin\xfe"  # a lossy decoding (U+FFFD) makes them one id

    def request(key, value, headers):
        return dict(key=key, value=value, headers=headers, partition=0)

    sent = kafka.produce_many(
        requests,
        [
            request(b"cancelled", b"never", native(topic, at(4), cancelled)),
            request(None, None, native(request_id=cancelled, action="CANCEL")),
            request(b"replaced", b"old", native(topic, at(4), replaced)),
            request(b"replaced", b"new", native(topic, at(5), replaced, "REPLACE")),
            request(b"twin-a", b"a", native(topic, at(4), twin_a)),
            request(b"twin-b", b"b", native(topic, at(4), twin_b)),
        ],
    )
    # A marker due after everything: once it has arrived, nothing earlier can still come.
    kafka.produce_many(requests, [request(b"marker", b"m", native(topic, at(8)))])
    reader.wait_for(lambda r: r.key == b"marker", timeout=WAIT, what="the marker", guard=scheduler.assert_running)
    scheduler.mark()  # the marker's batch has committed: everything it wrote is readable

    got = Counter((r.key, r.value) for r in reader.read_to_end())
    assert got == Counter(
        {(b"replaced", b"new"): 1, (b"twin-a", b"a"): 1, (b"twin-b", b"b"): 1, (b"marker", b"m"): 1}
    ), got
    offsets = {str(offset).encode() for _, offset in sent}
    assert [
        r
        for r in rejections.read_to_end()
        if r.header_values("x-scheduler-source-offset")[:1] and r.header("x-scheduler-source-offset") in offsets
    ] == [], "a binary id was rejected"
    # Five ADDs (the marker's included), one cancel, one replace; a collapsed twin would show as "replaced".
    assert scheduler.outcomes_since(mark, 7) == Counter({"scheduled": 5, "cancelled": 1, "replaced": 1})


@pytest.mark.parametrize("extra_args", [(), ("--lookahead", "0s")], ids=["timed-writer", "spark-sink"])
def test_a_request_just_under_the_record_limit_is_rejected_and_the_job_flows(kafka, scheduler_factory, extra_args):
    """The rejection of a request carries its value plus the reason and source headers: with a value of 8 MiB - 261
    bytes (the broker's and the scheduler's record limit is 8 MiB) it is over the limit, so it goes without its
    value. It once killed the timed writer, and later Spark's sink. Rejections are written by the timed writer, or
    with --lookahead 0 by Spark's Kafka sink."""
    scheduler = scheduler_factory(extra_args=extra_args).start()
    requests = f"{scheduler.app_id}-schedule-requests"
    topic = kafka.topic("near-limit")
    reader = kafka.reader(topic)
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    mark = scheduler.mark(timeout=WAIT)
    [(_, offset)] = kafka.produce_many(
        requests,
        [dict(key=b"huge", value=b"v" * (8 * 2**20 - 261), partition=0, headers=native(topic, at(-1), "huge"))],
    )
    kafka.produce_many(requests, [dict(key=b"after", value=b"ok", partition=0, headers=native(topic, at(1), "after"))])
    reader.wait_for(
        lambda r: r.key == b"after", timeout=WAIT, what="the request after the huge one", guard=scheduler.assert_running
    )
    scheduler.mark()  # the batch that delivered it has committed: the rejection before it is written if ever
    assert [r.key for r in reader.read_to_end()] == [b"after"]
    assert scheduler.outcomes_since(mark, 2) == Counter({"rejected": 1, "scheduled": 1})
    rejected = [
        r for r in rejections.read_to_end() if r.header_values("x-scheduler-source-offset") == [str(offset).encode()]
    ]
    assert [r.key for r in rejected] == [b"huge"] and rejected[0].value is None, "rejected, without its value"
    reasons = rejected[0].header_values("x-scheduler-rejection-reason")
    assert any(b"value is left out" in v for v in reasons), reasons
    assert scheduler.stop() == 0, scheduler.log()[-3000:]
