"""The status page without Kafka or Spark: the rings of recent lateness and rejections, the JSON of /api/status and
/api/upcoming, the health verdict, the background recount of upcoming deliveries, and the routes over HTTP. The page
in a browser against a real job: tests/integration/test_status_page.py."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.driver.batch_summary import BatchSummary
from kafka_scheduler.ops.http_server import Routes, start_server
from kafka_scheduler.ops.metrics import SchedulerMetrics
from kafka_scheduler.ops.recent import LatenessWindow, RecentRejections
from kafka_scheduler.ops.status_page import (
    LATE_P99_S,
    STALL_AFTER_S,
    StatusPage,
    health,
    iso,
    page_html,
    snapshot,
    status_json,
)
from kafka_scheduler.ops.upcoming import (
    DAY_MS,
    HOUR_MS,
    PendingCounts,
    StateReader,
    UpcomingCache,
    count_pending,
    counts_json,
    merged_counts,
    upcoming_json,
)

T0 = 1_800_000_000.0  # a fixed "now" (s)


# ---------------------------------------------------------------- the rings


def test_lateness_window_counts_exactly_and_reads_percentiles_to_two_percent():
    window = LatenessWindow()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1 s
    for v in values:
        window.add(v, now=T0)
    stats = window.stats(T0)
    assert stats["count"] == 1000 and stats["max_s"] == 1.0
    for q, key in ((0.50, "p50_s"), (0.99, "p99_s")):
        exact = sorted(values)[int(q * 1000) - 1]
        assert exact <= stats[key] <= exact * 1.02 + 0.001, (key, stats[key], exact)


def test_lateness_window_forgets_what_is_older_than_an_hour_and_keeps_one_slot_per_minute():
    window = LatenessWindow()
    window.add(30.0, n=5, now=T0 - 3700)
    window.add(0.2, n=3, now=T0 - 120)
    window.add(0.4, n=1, now=T0)
    stats = window.stats(T0)
    assert stats["count"] == 4 and stats["max_s"] == 0.4
    assert window.stats(T0, span_s=60)["count"] == 1
    slots = window.per_slot(T0)
    assert len(slots) == 60 and sum(s["count"] for s in slots) == 4 and slots[-1]["max_s"] == 0.4
    assert slots[0]["count"] == 0 and slots[0]["p99_s"] is None


def test_a_herd_of_deliveries_stays_small_in_memory():
    window = LatenessWindow()
    for i in range(200_000):
        window.add((i % 50_000) / 100, now=T0)  # 0 .. 500 s, 50,000 distinct values
    assert window.stats(T0)["count"] == 200_000
    [(counts, _)] = window._slots.values()
    assert len(counts) < 700, "lateness is kept on a 2% scale, not per value"


def test_recent_rejections_keep_the_last_fifty_newest_first():
    ring = RecentRejections()
    for i in range(60):
        ring.add(T0 + i, "requests", "native", "bad_time", i + 1)
    entries = ring.entries()
    assert len(entries) == 50 and entries[0]["count"] == 60 and entries[-1]["count"] == 11


def test_the_metrics_feed_the_rings_with_what_they_count():
    metrics = SchedulerMetrics({"requests": "native"})
    summary = BatchSummary(
        3, written_at_ms=int(T0 * 1000), dead_lettered=2, written_by_batch=4, earliest_due_ms=int(T0 * 1000) - 1500
    )
    summary.count_outcome("rejected@requests@bad_time", 2)
    summary.count_outcome("scheduled@requests", 5)
    metrics.record_batch(summary)
    metrics.record_written([10, 10, 250], refused=1)
    rejections = metrics.recent_rejections.entries()
    assert [(r["input_topic"], r["reason_class"], r["count"]) for r in rejections] == [
        (None, "refused_by_destination", 1),
        (None, "refused_by_destination", 2),
        ("requests", "bad_time", 2),
    ]
    assert (
        metrics.recent_lateness.stats()["count"]
        == metrics.value("kafka_scheduler_delivery_lateness_seconds_count")
        == 4 + 3
    )


# ---------------------------------------------------------------- /api/status


def fed_metrics() -> SchedulerMetrics:
    metrics = SchedulerMetrics({"requests": "native"})
    summary = BatchSummary(
        1,
        written_at_ms=int(T0 * 1000) - 4000,
        written_by_batch=2,
        earliest_due_ms=int(T0 * 1000) - 4100,
        index_entries={0: 7, 1: 5},
    )
    summary.count_outcome("scheduled@requests", 14)
    summary.count_outcome("cancelled@requests", 2)
    summary.count_outcome("rejected@requests@missing_field", 1)
    metrics.record_batch(summary)
    metrics.record_written([5, 20, 40], refused=0)
    metrics.record_lag({("requests", 0): 10, ("requests", 1): 4}, {("requests", 0): 13, ("requests", 1): 4})
    return metrics


def test_status_json_shows_the_values_of_the_registry():
    metrics = fed_metrics()
    page = StatusPage(metrics, "reminders", started_s=T0 - 60, clock=lambda: T0)
    status = page.status()
    assert status["pending"] == metrics.value("kafka_scheduler_pending_schedules") == 12
    assert status["delivered"]["total"] == metrics.value("kafka_scheduler_delivered_total") == 5
    assert status["requests"] == {"cancelled": 2, "scheduled": 14}
    assert status["rejected"] == {"total": 1, "by_class": {"missing_field": 1}}
    assert status["health"]["input_lag"] == [
        {"topic": "requests", "partition": 0, "records": 3},
        {"topic": "requests", "partition": 1, "records": 0},
    ]
    assert status["health"]["input_lag_total"] == 3 and status["health"]["last_batch_age_s"] == 4.0
    assert status["health"]["verdict"] == "ok" and status["app_id"] == "reminders"
    assert status["rejections"][0]["reason_class"] == "missing_field" and status["rejections"][0]["about"]
    json.dumps(status)  # all of it JSON


def test_the_next_due_time_is_the_earliest_counted_due_time_not_the_next_timer():
    """The next timer fires up to --lookahead plus a lead before the earliest due time: the page shows both, each for
    what it is, and the due time is the count's (NaN before the first count: not known)."""
    metrics = fed_metrics()
    due_s, timer_s, counted_s = T0 + 1810.0, T0 + 10.0, T0 - 5.0
    metrics.follow_next_wakeup(lambda: int(timer_s * 1000))
    page = StatusPage(metrics, "reminders", started_s=T0 - 60, clock=lambda: T0)
    assert page.status()["next_due"] == {"at": None, "in_s": None, "counted_at": None}
    metrics.follow_state_counts(lambda: (4, int(due_s * 1000), counted_s))
    status = page.status()
    assert status["next_due"] == {"at": iso(due_s), "in_s": 1810.0, "counted_at": iso(counted_s)}
    assert status["next_wakeup"] == {"at": iso(timer_s), "in_s": 10.0}
    metrics.follow_state_counts(lambda: (0, None, counted_s))  # nothing pending
    assert page.status()["next_due"] == {"at": None, "in_s": None, "counted_at": iso(counted_s)}


def test_status_json_of_a_job_that_did_nothing_yet():
    status = status_json(
        {}, T0, T0 - 5, "app", *[{"count": 0, "p50_s": None, "p99_s": None, "max_s": None}] * 2, [], []
    )
    assert status["pending"] == 0 and status["next_wakeup"] == {"at": None, "in_s": None}
    assert status["health"]["verdict"] == "starting" and status["health"]["last_batch"] is None


@pytest.mark.parametrize(
    "case,expected",
    [
        (dict(last_batch_s=T0 - 10, batches=3), "ok"),
        (dict(last_batch_s=T0 - 3600, batches=3), "ok"),  # idle: no batch without work
        (dict(last_batch_s=None, batches=0), "starting"),
        (dict(last_batch_s=T0 - 10, batches=3, recent_p99_s=LATE_P99_S + 1), "late"),
        (dict(last_batch_s=T0 - 10, batches=3, lag_total=50_000), "late"),
        (dict(last_batch_s=T0 - STALL_AFTER_S - 1, batches=3, lag_total=1), "stalled"),
        (dict(last_batch_s=None, batches=0, lag_total=1, started_s=T0 - STALL_AFTER_S - 1), "stalled"),
        (dict(last_batch_s=T0 - 600, batches=3, next_wakeup_s=T0 - STALL_AFTER_S - 1), "stalled"),
        (dict(last_batch_s=T0 - 10, batches=3, next_wakeup_s=T0 - STALL_AFTER_S - 1), "ok"),  # ran since that wake-up
    ],
)
def test_health_verdict(case, expected):
    given = {"started_s": T0 - 7200, "next_wakeup_s": None, "lag_total": 0, "recent_p99_s": None, **case}
    verdict = health(T0, **given)
    assert verdict["verdict"] == expected and verdict["reason"], verdict


# ---------------------------------------------------------------- /api/upcoming


def test_upcoming_counts_per_hour_and_day_from_the_current_hour_and_day():
    as_of = 1_800_000_000_000 // DAY_MS * DAY_MS + 10 * HOUR_MS + 123  # 10:00 and a bit, UTC
    dues = [
        as_of - 100,  # due already, not yet retired: in the current hour
        as_of + HOUR_MS,
        as_of + HOUR_MS + 5,
        as_of + 47 * HOUR_MS,
        as_of + 60 * HOUR_MS,
        as_of + 40 * DAY_MS,
    ]
    counts = count_pending([pd.DataFrame({"due_ms": dues[:3]}), pd.DataFrame({"due_ms": dues[3:]})], as_of)
    assert counts.total == 6 and counts.overdue == 1
    answer = upcoming_json(counts, as_of, batch=9)
    hours, days = answer["hours"], answer["days"]
    assert len(hours) == 48 and len(days) == 30 and answer["batch"] == 9
    assert hours[0]["start"].endswith("T10:00:00.000Z") and [h["count"] for h in hours[:2]] == [1, 2]
    assert hours[47]["count"] == 1 and answer["after_hours"] == 2 and answer["before_hours"] == 0
    assert [d["count"] for d in days[:3]] == [3, 0, 2] and answer["after_days"] == 1
    assert answer["total"] == 6 and answer["due_not_retired"] == 1
    assert counts.earliest_due_ms == answer["earliest_due_ms"] == as_of + HOUR_MS  # the overdue one is not pending


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-3 * DAY_MS, 40 * DAY_MS), max_size=6), max_size=5), st.integers(0, 4))
def test_counts_made_per_partition_and_merged_are_the_counts_of_the_whole(offsets, cut):
    """The executors count each partition's frames (counts_json) and the driver merges them (merged_counts)."""
    as_of = 1_800_000_000_000 + 123
    frames = [pd.DataFrame({"due_ms": [as_of + o for o in chunk]}, dtype="int64") for chunk in offsets]
    whole = count_pending(frames, as_of)
    parts = [counts_json(count_pending(frames[:cut], as_of)), counts_json(count_pending(frames[cut:], as_of))]
    assert merged_counts(parts) == whole


class FakeState:
    """A StateReader whose read returns at once, or when ``release`` is set."""

    def __init__(self, ready=True):
        self.ready, self.reads, self.release = ready, 0, threading.Event()
        self.release.set()

    def run(self, read, empty):
        self.release.wait(10)
        self.reads += 1
        return read("spark", "checkpoint", self.reads)


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_upcoming_is_counted_in_the_background_on_request_and_served_from_cache_meanwhile():
    now = [T0]
    state = FakeState()
    state.release.clear()
    cache = UpcomingCache(
        state,
        max_age_s=30,
        clock=lambda: now[0],
        count=lambda spark, checkpoint, as_of: PendingCounts(total=state.reads),
    )
    first = cache.get()
    assert first["state"] == "computing" and first["computing"]
    state.release.set()
    wait_for(lambda: cache.get()["state"] == "ready")
    answer = cache.get()
    assert answer["batch"] == 1 and answer["age_s"] == 0 and state.reads == 1
    now[0] += 10
    assert cache.get()["age_s"] == 10 and state.reads == 1, "fresh enough: no read"
    now[0] += 30
    state.release.clear()
    stale = cache.get()
    assert stale["state"] == "ready" and stale["batch"] == 1 and stale["computing"], "the last answer meanwhile"
    state.release.set()
    wait_for(lambda: cache.get()["batch"] == 2)
    assert state.reads == 2


def test_a_scrape_keeps_the_counted_gauges_current_and_reads_are_spaced_by_their_duration():
    now = [T0]
    state = FakeState()
    metrics = SchedulerMetrics({})
    page = StatusPage(metrics, "reminders", clock=lambda: now[0])
    page.state = state
    read_s = [0.0]

    def count(spark, checkpoint, as_of_ms):
        time.sleep(read_s[0])
        return PendingCounts(total=5 + state.reads, overdue=1, earliest_due_ms=as_of_ms + 60_000)

    page.upcoming = UpcomingCache(state, max_age_s=30, clock=lambda: now[0], count=count)
    metrics.follow_state_counts(page.upcoming.counted)
    routes = Routes(metrics, page)
    assert str(metrics.value("kafka_scheduler_counted_pending_schedules")) == "nan", "unknown before the first count"
    routes.answer("/metrics")  # the scrape starts the count; the next one sees it
    wait_for(lambda: metrics.value("kafka_scheduler_counted_timestamp_seconds") == T0)
    assert metrics.value("kafka_scheduler_counted_pending_schedules") == 5  # 6 in state, 1 already due
    assert metrics.value("kafka_scheduler_earliest_pending_due_timestamp_seconds") == T0 + 60
    read_s[0], now[0] = 0.2, T0 + 31
    routes.answer("/metrics")
    wait_for(lambda: metrics.value("kafka_scheduler_counted_timestamp_seconds") == T0 + 31)
    assert metrics.value("kafka_scheduler_counted_pending_schedules") == 6 and state.reads == 2
    read_s[0], now[0] = 2.0, T0 + 62  # this read takes 2 s: the next starts no sooner than 40 s after it
    routes.answer("/metrics")
    wait_for(lambda: metrics.value("kafka_scheduler_counted_timestamp_seconds") == T0 + 62)
    read_s[0], now[0] = 0.0, T0 + 62 + 35  # older than 30 s, but not 40
    routes.answer("/metrics")
    time.sleep(0.2)
    assert state.reads == 3
    now[0] = T0 + 62 + 41
    routes.answer("/metrics")
    wait_for(lambda: state.reads == 4)


def test_nobody_asking_means_no_state_read():
    state = FakeState()
    UpcomingCache(state, max_age_s=0, count=lambda *a: PendingCounts())
    time.sleep(0.2)
    assert state.reads == 0


def test_upcoming_before_spark_is_up_and_after_a_failed_read():
    waiting = UpcomingCache(FakeState(ready=False)).get()
    assert waiting["state"] == "waiting" and not waiting["computing"]

    def fails(*_):
        raise RuntimeError("state store unreadable\nstack trace")

    cache = UpcomingCache(FakeState(), count=fails)
    cache.get()
    wait_for(lambda: cache.get()["state"] == "error")
    assert cache.get()["error"] == "state store unreadable"


# ---------------------------------------------------------------- routes and the page


def test_routes_answer_with_the_right_status_and_type():
    metrics = fed_metrics()
    page = Routes(metrics, StatusPage(metrics, "reminders"))
    code, content_type, body = page.answer("/metrics")
    assert code == 200 and content_type.startswith("text/plain") and b"kafka_scheduler_pending_schedules 12.0" in body
    code, content_type, body = page.answer("/")
    assert code == 200 and content_type.startswith("text/html") and b"<canvas" in body
    code, _, body = page.answer("/api/status?x=1")
    assert code == 200 and json.loads(body)["pending"] == 12
    code, _, body = page.answer("/api/schedules?id=")
    assert code == 400 and "id" in json.loads(body)["error"]
    code, _, body = page.answer("/api/schedules?limit=0")
    assert code == 400 and "limit" in json.loads(body)["error"], "the listing checks its parameters first"
    code, _, body = page.answer("/api/schedules?page_token=x")
    assert code == 400 and "page_token" in json.loads(body)["error"]
    code, _, body = page.answer("/api/schedules?kind=cron&kind=one-shot")
    assert code == 400 and "once" in json.loads(body)["error"]
    code, _, body = page.answer("/api/schedules")
    assert code == 503 and "Spark" in json.loads(body)["error"], "a listing reads the state store"
    code, _, body = page.answer("/api/schedules?id=order-1")
    assert code == 503 and "Spark" in json.loads(body)["error"], "no Spark session attached yet"
    assert json.loads(page.answer("/api/upcoming")[2])["state"] == "waiting"
    code, _, body = page.answer("/nothing")
    assert code == 404 and "/api/status" in json.loads(body)["pages"]


def test_the_server_serves_metrics_and_page_over_http():
    metrics = fed_metrics()
    server = start_server(Routes(metrics, StatusPage(metrics, "reminders")), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
            assert b"kafka_scheduler_delivered_total 5.0" in response.read()
            assert response.headers["Content-Type"].startswith("text/plain; version=")
        with urllib.request.urlopen(base + "/api/status", timeout=10) as response:
            assert json.loads(response.read())["delivered"]["total"] == 5
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/api/schedules?id=", timeout=10)
        assert missing.value.code == 400
    finally:
        server.shutdown()
        server.server_close()


def test_the_page_is_self_contained_and_its_script_finds_its_elements():
    html = page_html().decode()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(\s*["']?(https?:)?//""", html)
    ids = set(re.findall(r'id="([\w-]+)"', html))
    used = set(re.findall(r'\$\("([\w-]+)"\)', html)) | set(re.findall(r'setNum\("([\w-]+)"', html))
    assert used <= ids, f"the script looks for elements the page lacks: {used - ids}"


def test_a_snapshot_is_what_a_scrape_reads():
    metrics = fed_metrics()
    samples = snapshot(metrics.registry)
    assert samples[("kafka_scheduler_input_lag_records", (("partition", "0"), ("topic", "requests")))] == 3


def test_the_demo_finds_the_status_page_in_the_line_the_job_logs(caplog):
    from kafka_scheduler.cli.demo import status_page_url
    from kafka_scheduler.ops.http_server import serve

    with caplog.at_level(logging.INFO, logger="kafka_scheduler.ops.http_server"):
        server = serve(SchedulerMetrics({}), "0.0.0.0", 0)
    try:
        [line] = [r.getMessage() for r in caplog.records if "status page" in r.getMessage()]
        assert status_page_url(f"2026-11-26 23:00:00 INFO {line}\n") == f"http://127.0.0.1:{server.server_port}/"
        assert status_page_url("running: reading requests (native)") is None
    finally:
        server.shutdown()
        server.server_close()


class FakeSpark:
    class sparkContext:
        descriptions: list = []

        @classmethod
        def setJobDescription(cls, text):
            cls.descriptions.append(text)


def test_state_reads_wait_for_spark_and_for_a_first_committed_batch(tmp_path):

    def read(spark, checkpoint_dir, batch):
        return ("read", checkpoint_dir, batch)

    reader = StateReader()
    assert reader.run(read, empty=lambda: "empty") is None, "no Spark session yet"
    reader.attach(FakeSpark(), str(tmp_path))
    assert reader.run(read, empty=lambda: "empty") == "empty", "nothing committed: no state to read"
    (tmp_path / "commits").mkdir()
    (tmp_path / "commits" / "4").write_text("v1\n{}")
    assert reader.run(read, empty=lambda: "empty") == ("read", str(tmp_path), 4)
    assert FakeSpark.sparkContext.descriptions[-2:] == ["kafka-scheduler status page: state read", None]
    reader.detach()
    assert reader.run(read, empty=lambda: "empty") is None
