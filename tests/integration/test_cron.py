"""Recurring schedules (issue 19) with a real broker and job, on Kaspr's exact wire: the CRON_* requests are written
by hand here, header by header (support.native), as a Kaspr producer writes them.

Crons fire every 5 s (``* * * * * */5``, seconds last, as Kaspr reads six fields), so each test takes seconds of
firings. Every firing is a delivery of its own: ``x-scheduler-delivery-id`` = the activating request's id and the
instant, ``x-scheduler-cron-fire-timestamp`` its Unix seconds (as Kaspr writes it), never early.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from .support import at, batch_lines, ms_of, native, wait_until

EVERY_5S = "* * * * * */5"
PERIOD_MS = 5000


def cron_headers(to: str, request_id: str, expr: str = EVERY_5S, action: str = "CRON_ADD", extra=(), **cron):
    """A Kaspr CRON_* request's headers, by hand: policy, timezone, start, end and max lateness as given."""
    headers = native(to, None, request_id, action=action, extra=extra)
    if action == "CRON_ADD":
        headers.append(("x-scheduler-cron-expr", expr.encode()))
    names = {
        "policy": "x-scheduler-cron-missed-fire-policy",
        "timezone": "x-scheduler-cron-timezone",
        "start_at": "x-scheduler-cron-start-at",
        "end_at": "x-scheduler-cron-end-at",
        "max_lateness": "x-scheduler-max-lateness",
    }
    headers += [(names[name], str(value).encode()) for name, value in cron.items()]
    return headers


def control(request_id: str, action: str):
    return native(request_id=request_id, action=action)


def instant_of(record) -> int:
    """The firing instant (ms) its delivery id names."""
    return int(record.header("x-scheduler-delivery-id").decode().rsplit("@", 1)[1])


def firings(reader, key: bytes) -> list:
    return sorted((r for r in reader.poll() if r.key == key), key=instant_of)


def assert_firings_well_formed(records, activation: bytes) -> None:
    """Each on a multiple of 5 s, written at or after it, with its own id made of the activation and its instant."""
    for record in records:
        instant = instant_of(record)
        assert instant % PERIOD_MS == 0, record
        assert record.timestamp_ms >= instant, f"delivered {instant - record.timestamp_ms} ms early"
        assert record.header("x-scheduler-delivery-id") == activation + b"@" + str(instant).encode()
        assert record.header("x-scheduler-cron-fire-timestamp") == str(instant // 1000).encode()
    ids = Counter(r.header("x-scheduler-delivery-id") for r in records)
    assert all(n == 1 for n in ids.values()), ids


@pytest.fixture(scope="module")
def job(scheduler_factory):
    """One warm job for the tests that need no restart (default --lookahead 3s: each firing is prepared and held)."""
    return scheduler_factory(app_id="crons").start().warm_up()


def test_every_cron_action_on_kaspr_wire(kafka, job):
    requests = f"{job.app_id}-schedule-requests"
    rejections = kafka.reader(f"{job.app_id}-schedule-rejections")
    topic = kafka.topic()
    reader = kafka.reader(topic)
    mark = job.mark()
    sent = kafka.produce_many(
        requests,
        [
            dict(
                key=b"tick",
                value=b"every 5 s",
                headers=cron_headers(topic, "ticker", extra=[("trace", b"t-1")]),
                partition=0,
            ),
            dict(key=b"paused", value=b"p", headers=cron_headers(topic, "replayed", policy="replay"), partition=0),
            dict(key=b"skipped", value=b"s", headers=cron_headers(topic, "skipped", policy="skip"), partition=0),
            # refused by the rules, with their headers as sent
            dict(key=b"bad", headers=cron_headers(topic, "bad-1", expr="every minute"), partition=0),
            dict(key=b"bad", headers=cron_headers(topic, "bad-2", expr="* * * * * */2"), partition=0),
            dict(key=b"bad", headers=cron_headers(topic, "bad-3", timezone="Mars/Olympus"), partition=0),
            # ids of crons and of one-shots are apart
            dict(headers=control("ticker", "CANCEL"), partition=0),
            dict(headers=control("nobody", "CRON_PAUSE"), partition=0),
        ],
    )
    ticker = f"{requests}-0-{sent[0][1]}".encode()
    counts = job.outcomes_since(mark, 8)
    assert counts == Counter({"cron_added": 3, "rejected": 3, "cancel_noop": 1, "cron_pause_noop": 1}), counts

    reasons = {
        r.header("x-scheduler-request-id"): r.header("x-scheduler-rejection-reason").decode()
        for r in rejections.wait_for(lambda r: r.key == b"bad", count=3, timeout=60, what="the three rejections")
    }
    assert reasons[b"bad-1"].startswith("invalid x-scheduler-cron-expr 'every minute'")
    assert "more often than the minimum interval 5s" in reasons[b"bad-2"]
    assert reasons[b"bad-3"].startswith("unknown time zone 'Mars/Olympus'")

    reader.wait_for(lambda r: r.key == b"tick", count=3, timeout=60, what="three firings", guard=job.assert_running)
    # Pause two crons once each has fired; the firings missed while paused come back (replay) or not (skip).
    reader.wait_for(lambda r: r.key == b"skipped", timeout=30, what="a firing of the skip cron")
    mark = job.mark()
    kafka.produce_many(
        requests,
        [
            dict(headers=control("replayed", "CRON_PAUSE"), partition=0),
            dict(headers=control("skipped", "CRON_PAUSE"), partition=0),
        ],
    )
    assert job.outcomes_since(mark, 2) == Counter({"cron_paused": 2})
    paused_at = int(time.time() * 1000)
    wait_until(lambda: time.time() * 1000 > paused_at + 4 * PERIOD_MS, 40, "four periods while paused")
    mark = job.mark()
    sent = kafka.produce_many(
        requests,
        [
            dict(headers=control("replayed", "CRON_RESUME"), partition=0),
            dict(headers=control("skipped", "CRON_RESUME"), partition=0),
            dict(headers=control("skipped", "CRON_RESUME"), partition=0),
        ],
    )
    resumed = {b"paused": f"{requests}-0-{sent[0][1]}".encode(), b"skipped": f"{requests}-0-{sent[1][1]}".encode()}
    assert job.outcomes_since(mark, 3) == Counter({"cron_resumed": 2, "cron_resume_noop": 1})
    resumed_at = int(time.time() * 1000)
    reader.wait_for(
        lambda r: r.key in resumed and instant_of(r) > resumed_at,
        count=2,
        timeout=60,
        what="a firing of each resumed cron after the resume",
    )

    # replay: every instant once, no gap: those missed while paused delivered at once, in order; the first keeps
    # the id the pause withdrew it with (a batch running at its instant withdraws it too late: a duplicate with the
    # same id, which a consumer drops), the others have the ids of the resume's activation
    records = list({r.header("x-scheduler-delivery-id"): r for r in firings(reader, b"paused")}.values())
    instants = [instant_of(r) for r in records]
    assert instants == list(range(instants[0], instants[-1] + 1, PERIOD_MS)), instants
    replayed = [r for r in records if r.header("x-scheduler-delivery-id").startswith(resumed[b"paused"] + b"@")]
    assert [i for i in map(instant_of, replayed) if paused_at + PERIOD_MS <= i <= resumed_at - 2 * PERIOD_MS]
    assert_firings_well_formed(replayed, resumed[b"paused"])
    # skip: none of the firings due while paused
    skipped = [instant_of(r) for r in firings(reader, b"skipped")]
    assert not [i for i in skipped if paused_at + PERIOD_MS <= i <= resumed_at - 2 * PERIOD_MS], (
        skipped,
        paused_at,
        resumed_at,
    )
    assert len(set(skipped)) == len(skipped)

    mark = job.mark()
    kafka.produce_many(
        requests,
        [dict(headers=control(i, "CRON_CANCEL"), partition=0) for i in ("ticker", "replayed", "skipped", "ticker")],
    )
    assert job.outcomes_since(mark, 4) == Counter({"cron_cancelled": 3, "cron_cancel_noop": 1})
    cancelled_at = int(time.time() * 1000)
    job.mark()
    wait_until(lambda: time.time() * 1000 > cancelled_at + 2 * PERIOD_MS, 30, "two periods after the cancel")
    job.mark()
    records = reader.read_to_end()
    assert not [r for r in records if instant_of(r) > cancelled_at + 1000], "a firing after the cancel"
    ticks = firings(reader, b"tick")
    assert_firings_well_formed(ticks, ticker)
    assert all(r.value == b"every 5 s" and r.header("trace") == b"t-1" for r in ticks)
    assert not [
        name
        for r in ticks
        for name, _ in r.headers
        if name.startswith("x-scheduler-")
        and name not in ("x-scheduler-delivery-id", "x-scheduler-cron-fire-timestamp")
    ]
    totals = Counter()
    for line in batch_lines(job.log()):
        totals.update(line.outcomes)
    assert totals["cron_added"] >= 3


def test_a_delivery_later_than_its_max_lateness_goes_to_rejections_as_expired(kafka, job):
    """One-shots: due 10 s ago with 2 s of max lateness, expired; with an hour, delivered."""
    requests = f"{job.app_id}-schedule-requests"
    rejections = kafka.reader(f"{job.app_id}-schedule-rejections")
    topic = kafka.topic()
    reader = kafka.reader(topic)
    past = at(-10)
    kafka.produce_many(
        requests,
        [
            dict(
                key=b"stale",
                value=b"9:00 reminder",
                headers=native(topic, past, "stale", extra=[("x-scheduler-max-lateness", b"2s")]),
                partition=0,
            ),
            dict(
                key=b"fresh",
                value=b"v",
                headers=native(topic, past, "fresh", extra=[("x-scheduler-max-lateness", b"PT1H")]),
                partition=0,
            ),
        ],
    )
    [expired] = rejections.wait_for(lambda r: r.key == b"stale", timeout=60, what="the expired one")
    reader.wait_for(lambda r: r.key == b"fresh", timeout=60, what="the one within its max lateness")
    assert expired.value == b"9:00 reminder"
    reason = expired.header("x-scheduler-rejection-reason").decode()
    assert reason.startswith("expired: due ") and reason.endswith("not delivered within its max lateness of 2000 ms")
    assert expired.header("x-scheduler-due-ms") == str(ms_of(past)).encode()
    job.mark()
    assert not [r for r in reader.read_to_end() if r.key == b"stale"]
    # Said by the batch that expired it, or by the timed writer that wrote it early, as its request was read.
    assert "later than their max lateness" in job.log()


def test_firings_missed_while_the_job_was_down(kafka, scheduler_factory):
    """Stopped for ~15 s with two crons, one of each policy: with replay every firing missed is delivered at once when
    the job is back (those later than their max lateness as expired rejections), with skip none of them; then both
    fire on, never early."""
    scheduler = scheduler_factory().start().warm_up()
    requests = f"{scheduler.app_id}-schedule-requests"
    rejections = kafka.reader(f"{scheduler.app_id}-schedule-rejections")
    topic = kafka.topic()
    reader = kafka.reader(topic)
    policies = {b"replay": "replay", b"skip": "skip"}  # the record key names the cron's policy
    kafka.produce_many(
        requests,
        [
            dict(
                key=key, value=b"v", partition=0, headers=cron_headers(topic, policy, policy=policy, max_lateness="12s")
            )
            for key, policy in policies.items()
        ],
    )
    for key in policies:
        reader.wait_for(
            lambda r, key=key: r.key == key,
            count=2,
            timeout=90,
            what=f"two firings of the {key.decode()} cron",
            guard=scheduler.assert_running,
        )
    assert scheduler.stop() == 0, scheduler.log()[-2000:]
    stopped_at = int(time.time() * 1000)
    before = list(reader.read_to_end())  # the reader keeps adding to the list it returns
    wait_until(lambda: time.time() * 1000 > stopped_at + 15_000, 30, "15 s down")
    scheduler.start()
    started_ms = int(scheduler.started_at * 1000)
    for key in policies:
        reader.wait_for(
            lambda r, key=key: r.key == key and instant_of(r) > started_ms + PERIOD_MS,
            timeout=120,
            what=f"a firing of the {key.decode()} cron after the restart",
            guard=scheduler.assert_running,
        )
    scheduler.mark()
    records, expired_records = reader.read_to_end(), rejections.read_to_end()
    for key, policy in policies.items():
        last = max(instant_of(r) for r in before if r.key == key)
        instants = sorted(instant_of(r) for r in records if r.key == key)
        expired = sorted(instant_of(r) for r in expired_records if r.key == key)
        # Missed: due while no job ran. Those due while the first job was stopping (a graceful stop can take many
        # seconds on a loaded machine) were due while it ran: delivered late, or expired.
        missed = [i for i in range(last + PERIOD_MS, started_ms, PERIOD_MS) if i > stopped_at]
        assert len(missed) >= 2, (policy, last, started_ms)
        if policy == "replay":
            # every instant once: delivered, or (more than 12 s late when the job was back) rejected as expired
            assert sorted(instants + expired) == list(range(instants[0], instants[-1] + 1, PERIOD_MS)), (
                instants,
                expired,
            )
            assert set(missed) <= set(instants) | set(expired)
        else:
            assert not set(missed) & set(instants + expired), (missed, instants)
        assert all(n == 1 for n in Counter(instants).values()), (policy, instants)
        of_cron = [r for r in records if r.key == key]
        assert_firings_well_formed(of_cron, of_cron[0].header("x-scheduler-delivery-id").rsplit(b"@", 1)[0])
    assert "cron firings missed while the job was down, skipped" in scheduler.log()
    assert scheduler.stop() == 0


def test_a_kill_9_while_a_firing_is_held_loses_it_not_and_keeps_its_id(kafka, scheduler_factory):
    """--lookahead 20s with a cron every 10 s: each firing is prepared as soon as the one before is retired, held by
    the driver until its instant. A kill -9 then: the next run delivers it, with the same delivery id, not early."""
    first = scheduler_factory(app_id="cron-kill", extra_args=("--lookahead", "20s")).start().warm_up()
    requests = f"{first.app_id}-schedule-requests"
    topic = kafka.topic()
    reader = kafka.reader(topic)
    kafka.produce(requests, key=b"c", value=b"v", headers=cron_headers(topic, "c", expr="* * * * * */10"), partition=0)
    reader.wait_for(lambda r: r.key == b"c", timeout=90, what="a firing", guard=first.assert_running)
    mark = first.log_size()
    wait_until(
        lambda: any(b.held for b in batch_lines(first.log_since(mark))),
        60,
        "the next firing to be held",
        guard=first.assert_running,
    )
    held_at = int(time.time() * 1000)
    first.kill_tree()
    before = {instant_of(r) for r in reader.read_to_end()}
    second = scheduler_factory(
        app_id="cron-kill", checkpoint_dir=first.checkpoint_dir, extra_args=("--lookahead", "20s")
    ).start()
    try:
        reader.wait_for(
            lambda r: instant_of(r) > held_at + 10_000,
            timeout=180,
            what="the firings after the kill",
            guard=second.assert_running,
        )
        second.mark()
        records = [r for r in reader.read_to_end() if r.key == b"c"]
    finally:
        code = second.stop()
    instants = sorted({instant_of(r) for r in records})
    assert instants == list(range(instants[0], instants[-1] + 1, 10_000)), "a firing lost"
    assert (set(instants) - before) and all(r.timestamp_ms >= instant_of(r) for r in records), "early"
    by_instant: dict = {}
    for record in records:  # a firing written before the kill and again after it carries the same id
        by_instant.setdefault(instant_of(record), set()).add(record.header("x-scheduler-delivery-id"))
    assert all(len(ids) == 1 for ids in by_instant.values()), by_instant
    assert code == 0
