"""The listing (``kafka-scheduler list``, ``GET /api/schedules`` without id) without Spark: paging by (due time,
delivery id) over a state that moves on between pages (shards laying their buckets out each its own way), the filters,
the tokens, what a page reads and keeps. The engine's reader of the state on local Spark: test_state_reader.py; the
real state store of a running job: tests/integration/test_listing.py."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.rules.buckets import BUCKET_MS, COARSE_LEVELS, key_at, level_width
from kafka_scheduler.engine.spark.state_reader import Bucket, bucket_span_ms, span_sql, time_order
from kafka_scheduler.ops import listing
from kafka_scheduler.ops.listing import (
    BadPageToken,
    Cursor,
    ListFilters,
    decode_token,
    encode_token,
    find_schedule,
    list_query,
    list_schedules,
    render_table,
    schedule_view,
    sid_parts,
)

T0 = 1_800_000_000_000


def row(
    due_ms: int, delivery: str, sid: bytes | None = b"id:requests/x", topic: str = "orders", value=b"v", **extra
) -> dict:
    return {
        "due_ms": due_ms,
        "topic": topic,
        "key": b"k",
        "value": value,
        "headers": [{"key": "h", "value": b"1"}],
        "delivery_id": delivery,
        "partition": None,
        "sid": sid,
        **extra,
    }


def one_second_buckets(due_ms: int, shard: int = 0) -> int:
    return due_ms // BUCKET_MS


def coarse_and_one_second_buckets(due_ms: int, shard: int = 0) -> int:
    """Bucket keys as the wheel's coarse levels lay them out (disjoint spans): every third ~68-minute span is one
    level-2 bucket; of the rest, even 64 s spans are level-1 buckets, odd ones one-second buckets."""
    if due_ms // level_width(2) % 3 == 2:
        return key_at(2, due_ms)
    return key_at(1 if due_ms // level_width(1) % 2 == 0 else 0, due_ms)


def a_layout_per_shard(due_ms: int, shard: int = 0) -> int:
    """Each shard lays its buckets out its own way, as the wheel's shards do (their coarse buckets are made when
    their own schedules come): shard 0 in level-2 buckets (~68 minutes), shard 1 in level-1 ones (64 s), shard 2 in
    seconds. A coarse bucket of one shard then spans buckets of the others."""
    return key_at((2, 1, 0)[shard % 3], due_ms)


class FakeState:
    """A PendingSource over (shard, bucket) -> chunk frames, with struck delivery ids; counts what is read."""

    def __init__(self, rows=(), shards: int = 3, chunk_rows: int = 4, bucket_of=one_second_buckets):
        self.bucket_of = bucket_of
        self.chunks: dict[tuple[int, int, int], pd.DataFrame] = {}
        self.struck: dict[tuple[int, int], set] = {}
        self.shards, self.chunk_rows = shards, chunk_rows
        self.rows_shipped = 0
        self.reads: list[tuple] = []
        self._count: dict[tuple[int, int], int] = {}
        self.paused: list[dict] = []  # paused crons: the ``paused`` state variable
        self.add(rows)

    def add(self, rows) -> None:
        by_place: dict[tuple[int, int], list] = {}
        for r in rows:
            shard = sum(bytes(r["sid"] or r["delivery_id"].encode())) % self.shards
            by_place.setdefault((shard, self.bucket_of(r["due_ms"], shard)), []).append(r)
        for (shard, bucket), found in by_place.items():
            for i in range(0, len(found), self.chunk_rows):
                n = self._count.get((shard, bucket), 0)
                self._count[(shard, bucket)] = n + 1
                self.chunks[(shard, bucket, n)] = pd.DataFrame(found[i : i + self.chunk_rows])

    def strike(self, delivery_id: str) -> None:
        for (shard, bucket, _), frame in self.chunks.items():
            if delivery_id in set(frame["delivery_id"]):
                self.struck.setdefault((shard, bucket), set()).add(delivery_id)

    def pending_rows(self) -> list[dict]:
        return [
            r
            for (shard, bucket, _), frame in self.chunks.items()
            for r in frame.to_dict("records")
            if r["delivery_id"] not in self.struck.get((shard, bucket), set())
        ]

    def buckets(self, from_ms, before_ms, with_paused=False):
        self.reads.append(("buckets", from_ms, before_ms, with_paused))
        found = {}
        for shard, key, n in self.chunks:
            start, end = bucket_span_ms(key)
            if (from_ms is None or end > from_ms) and (before_ms is None or start < before_ms):
                found.setdefault((shard, key), []).append((n, len(self.chunks[(shard, key, n)])))
        buckets = time_order(Bucket(s, k, *bucket_span_ms(k), tuple(sorted(c))) for (s, k), c in found.items())
        paused = [pd.DataFrame(self.paused)] if with_paused and self.paused else []
        return buckets, paused

    def pending(self, buckets):
        for bucket in buckets:
            gone = self.struck.get((bucket.shard, bucket.key), set())
            for n, _ in bucket.chunks:
                frame = self.chunks[(bucket.shard, bucket.key, n)]
                self.rows_shipped += len(frame)
                yield bucket, frame[~frame["delivery_id"].isin(gone)].copy()


def page(state: FakeState, filters=ListFilters(), limit=3, token=None, batch=1):
    cursor = decode_token(token, filters) if token else None
    return list_schedules(state, filters, limit, cursor, T0, batch, view=lambda r: (int(r["due_ms"]), r["delivery_id"]))


def every_page(state, filters=ListFilters(), limit=3, between=lambda n: None):
    shown, token, n = [], None, 0
    while True:
        found = page(state, filters, limit, token, batch=n)
        shown += found.schedules
        assert len(found.schedules) <= limit
        token = found.next_token
        if token is None:
            return shown
        between(n)
        n += 1


def test_pages_list_every_schedule_once_by_due_time_then_delivery_id():
    rows = [row(T0 + (i % 7) * 400, f"requests-0-{i:03d}", sid=f"id:requests/r{i}".encode()) for i in range(40)]
    state = FakeState(rows)
    shown = every_page(state, limit=6)
    assert shown == sorted((r["due_ms"], r["delivery_id"]) for r in rows)
    assert page(state, limit=40).next_token is None, "no token when nothing follows"
    assert page(state, limit=39).next_token is not None


def test_struck_versions_are_not_listed():
    state = FakeState([row(T0, "a-0-1"), row(T0, "a-0-2"), row(T0 + 5000, "a-0-3")])
    state.strike("a-0-2")
    assert every_page(state, limit=1) == [(T0, "a-0-1"), (T0 + 5000, "a-0-3")]


def test_filters_on_due_time_destination_id_prefix_and_kind():
    rows = [
        row(T0, "t-0-1", sid=b"id:requests/order-1"),
        row(T0 + 1, "t-0-2", sid=b"id:requests/mail-1"),
        row(T0 + 2, "t-0-3", sid=b"cron:requests/order-daily", topic="mails"),
        row(T0 + 3000, "t-0-4", sid=b"offset:requests/0/4"),
        row(T0 + 9000, "t-0-5", sid=None),
    ]
    state = FakeState(rows)

    def ids(**filters):
        return [d for _, d in every_page(state, ListFilters(**filters), limit=2)]

    assert ids() == ["t-0-1", "t-0-2", "t-0-3", "t-0-4", "t-0-5"]
    assert ids(due_after_ms=T0 + 1, due_before_ms=T0 + 9000) == ["t-0-2", "t-0-3", "t-0-4"]
    assert ids(destination="mails") == ["t-0-3"]
    assert ids(id_prefix="order") == ["t-0-1", "t-0-3"]
    assert ids(kind="cron") == ["t-0-3"] and ids(kind="one-shot") == ["t-0-1", "t-0-2", "t-0-4", "t-0-5"]


def test_a_page_reads_the_first_buckets_only_and_keeps_a_bounded_number_of_rows():
    # 600 buckets of 50 schedules: a page of 10 reads the buckets up to the first that starts after its 11th schedule.
    rows = [row(T0 + b * BUCKET_MS + i, f"r-0-{b:05d}{i:02d}") for b in range(600) for i in range(50)]
    state = FakeState(rows, chunk_rows=25)
    found = page(state, limit=10)
    assert [d for _, d in found.schedules] == [f"r-0-00000{i:02d}" for i in range(10)]
    assert state.rows_shipped <= 2 * 50, state.rows_shipped
    assert state.reads == [("buckets", None, None, True)], "one look at the buckets, on a first page with the paused"
    # A filter that matches little reads on to the end.
    state.rows_shipped, state.reads = 0, []
    sparse = page(state, ListFilters(id_prefix="nothing"), limit=10)
    assert sparse.schedules == [] and sparse.next_token is None
    assert state.rows_shipped == len(rows)
    # A page after a cursor, or with due-time filters, looks at the buckets of its range only.
    state.reads = []
    page(state, ListFilters(due_after_ms=T0 + 7 * BUCKET_MS, due_before_ms=T0 + 9 * BUCKET_MS), limit=10)
    assert state.reads == [("buckets", T0 + 7 * BUCKET_MS, T0 + 9 * BUCKET_MS, False)]


def test_the_first_rows_are_kept_in_bounded_memory():
    first = listing.FirstRows(5)
    biggest = 0
    for n in range(200):
        first.add(pd.DataFrame({"due_ms": [T0 - n] * 10, "delivery_id": [f"d{n}-{i}" for i in range(10)]}))
        biggest = max(biggest, first._rows)
    assert biggest <= 4 * 5 + 1024 + 10
    assert list(first.frame()["due_ms"]) == [T0 - 199] * 5


def test_the_next_page_reads_the_newest_state_after_the_last_key_shown():
    rows = [row(T0 + i * 1000, f"r-0-{i:02d}", sid=f"id:requests/r{i}".encode()) for i in range(10)]
    state = FakeState(rows)
    first = page(state, limit=4, batch=7)
    assert [d for _, d in first.schedules] == ["r-0-00", "r-0-01", "r-0-02", "r-0-03"]
    state.strike("r-0-02")  # shown already: nothing to do with the next page
    state.strike("r-0-05")  # cancelled before it was listed: not shown
    state.add([row(T0 + 500, "new-0-1"), row(T0 + 5500, "new-0-2")])  # before the cursor: not shown; after: shown
    second = page(state, limit=4, token=first.next_token, batch=9)
    assert [d for _, d in second.schedules] == ["r-0-04", "new-0-2", "r-0-06", "r-0-07"]
    answer = second.to_json()
    assert answer["continued_from_batch"] == 7 and answer["batch"] == 9 and answer["state_moved_on"]
    assert not first.to_json()["state_moved_on"]


PAGING_SCRIPT = (
    st.lists(st.tuples(st.integers(0, 40), st.integers(0, 3)), min_size=0, max_size=60),
    st.integers(1, 7),
    st.lists(st.tuples(st.sampled_from(["cancel", "add"]), st.integers(0, 80)), max_size=20),
    st.data(),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*PAGING_SCRIPT)
def test_paging_while_state_moves_on_lists_no_schedule_twice_and_every_one_pending_throughout_once(
    spec, limit, changes, data
):
    check_paging(spec, limit, changes, data, step_ms=300, bucket_of=one_second_buckets)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*PAGING_SCRIPT)
def test_paging_over_coarse_buckets_keeps_the_order_and_the_due_time_filters(spec, limit, changes, data):
    """Dues ~3.5 minutes to ~2.5 hours apart in level-1, level-2 and one-second buckets (the wheel's coarse levels):
    bucket keys no longer follow the due times, their spans do."""
    check_paging(spec, limit, changes, data, step_ms=level_width(1) * 7 // 2, bucket_of=coarse_and_one_second_buckets)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(*PAGING_SCRIPT)
def test_paging_over_shards_of_different_layouts_keeps_the_order(spec, limit, changes, data):
    """A coarse bucket of one shard spans the one-second buckets of another: a page is final only once nothing
    unread can hold a schedule due before its last one."""
    check_paging(spec, limit, changes, data, step_ms=level_width(1) // 3, bucket_of=a_layout_per_shard)


def check_paging(spec, limit, changes, data, step_ms, bucket_of):
    rows = [
        row(T0 + due * step_ms, f"r-{i}", sid=f"id:requests/r{i}".encode(), topic=f"t{dest}")
        for i, (due, dest) in enumerate(spec)
    ]
    state = FakeState(rows, chunk_rows=3, bucket_of=bucket_of)
    filters = data.draw(
        st.sampled_from(
            [
                ListFilters(),
                ListFilters(destination="t1"),
                ListFilters(due_after_ms=T0 + 10 * step_ms + 7, due_before_ms=T0 + 30 * step_ms + 11),
            ]
        )
    )
    removed: set = set()
    pending_throughout = {r["delivery_id"] for r in rows}
    plan = list(changes)

    def between(n):
        for _ in range(2):
            if not plan:
                return
            what, at = plan.pop()
            if what == "cancel" and rows:
                victim = rows[at % len(rows)]["delivery_id"]
                state.strike(victim)
                removed.add(victim)
            else:
                state.add([row(T0 + at * step_ms // 2, f"n-{n}-{at}-{len(plan)}", topic=f"t{at % 4}")])

    shown = every_page(state, filters, limit, between)
    keys = [d for _, d in shown]
    assert len(keys) == len(set(keys)), "no schedule listed twice"
    assert shown == sorted(shown), "in (due time, delivery id) order"
    wanted = {
        r["delivery_id"]
        for r in rows
        if r["delivery_id"] in pending_throughout - removed
        and listing.keep(pd.DataFrame([r]), filters, None).shape[0] == 1
    }
    assert wanted <= set(keys), "every schedule pending all along and matching is listed"


# ---------------------------------------------------------------- tokens and the query


def test_a_token_is_opaque_and_refused_when_damaged_or_made_for_other_filters():
    filters = ListFilters(destination="orders")
    token = encode_token(Cursor(T0, "requests-0-12", 41, filters.fingerprint()))
    assert set(token) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert decode_token(token, filters) == Cursor(T0, "requests-0-12", 41, filters.fingerprint())
    with pytest.raises(BadPageToken, match="other filters"):
        decode_token(token, ListFilters(destination="mails"))
    for bad in (
        "",
        "not a token",
        token[:-3],
        "x" * 5000,
        encode_token(Cursor(T0, "d", 1, "f"))[:-1] + "!",
        listing.base64.urlsafe_b64encode(
            json.dumps({"v": 1, "d": "soon", "i": "x", "b": 1, "f": filters.fingerprint()}).encode()
        ).decode(),
        listing.base64.urlsafe_b64encode(b"[1, 2]").decode(),
    ):
        with pytest.raises(BadPageToken):
            decode_token(bad, filters)


def test_the_query_of_a_page_is_checked_parameter_by_parameter():
    filters, limit, cursor = list_query(
        {"due_after": "2027-01-15T08:00:00Z", "destination": "orders", "kind": "cron", "limit": "7"}
    )
    assert filters.due_after_ms == 1_800_000_000_000 and filters.kind == "cron" and limit == 7 and cursor is None
    assert list_query({})[1] == listing.DEFAULT_LIMIT
    for values, message in (
        ({"limit": "0"}, "limit"),
        ({"limit": "1001"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"kind": "weekly"}, "kind"),
        ({"due_before": "tomorrow"}, "due_before"),
        ({"due_after": "2027-01-15T08:00:00"}, "time zone"),
        ({"dest": "x"}, "unknown"),
        ({"page_token": "zzz"}, "page token"),
    ):
        with pytest.raises(ValueError, match=message):
            list_query(values)


# ---------------------------------------------------------------- what a schedule shows


def test_a_schedule_shows_its_kind_its_cron_columns_and_the_actions_the_page_offers():
    assert sid_parts(b"id:requests/a/b") == ("one-shot", "requests", b"a/b")
    assert sid_parts(b"cron:requests/daily") == ("cron", "requests", b"daily")
    assert sid_parts(b"offset:requests/0/4") == ("one-shot", "requests", None)
    assert sid_parts(None) == ("one-shot", None, None)
    one = schedule_view(pd.Series(row(T0, "requests-0-1", sid=b"id:requests/o-1")), T0 + 1, ["requests"])
    assert (one["kind"], one["id"], one["due_already"], one["actions"]) == ("one-shot", "o-1", True, ["CANCEL"])
    assert one["headers"] == [{"key": "h", "value": "1"}] and "cron" not in one
    cron = schedule_view(
        pd.Series(
            row(
                T0,
                "requests-0-2",
                sid=b"cron:requests/daily",
                cron_expr="0 9 * * *",
                cron_tz="Europe/Paris",
                cron_policy="skip",
                cron_start_ms=float("nan"),
                cron_end_ms=T0 + 86_400_000,
            )
        ),
        T0,
        ["requests"],
    )
    assert cron["kind"] == "cron" and cron["actions"] == ["CRON_PAUSE", "CRON_CANCEL"]
    assert cron["cron"] == {
        "expr": "0 9 * * *",
        "timezone": "Europe/Paris",
        "missed_fire_policy": "skip",
        "end_at": "2027-01-16T08:00:00.000Z",
    }
    plain = schedule_view(
        pd.Series(row(T0, "requests-0-5", sid=b"id:requests/o-3", cron_expr=None, cron_start_ms=pd.NA)),
        T0,
        ["requests"],
    )
    assert "cron" not in plain, "a one-shot's empty cron columns show nothing"
    # A chunk's nullable integer columns hold pandas' NA (a job's chunk did, and the page failed on it).
    unbounded = schedule_view(
        pd.Series(
            row(
                T0,
                "requests-0-6",
                sid=b"cron:requests/new-year",
                cron_expr="0 0 1 1 *",
                cron_tz=None,
                cron_policy=None,
                cron_start_ms=pd.NA,
                cron_end_ms=pd.NA,
            )
        ),
        T0,
        ["requests"],
    )
    assert unbounded["cron"] == {"expr": "0 0 1 1 *", "timezone": "UTC", "missed_fire_policy": "replay"}
    other = schedule_view(pd.Series(row(T0, "karafka-0-1", sid=b"id:karafka/o-2")), T0, ["requests"])
    assert other["actions"] == [], "not a native input: the page writes native requests only"
    binary = schedule_view(pd.Series(row(T0, "requests-0-3", sid=b"id:requests/\xff")), T0, ["requests"])
    assert binary["id"] == "0xff" and binary["actions"] == [], "an id that is not text cannot be sent back as text"
    assert schedule_view(pd.Series(row(T0, "requests-0-4", sid=None)), T0, ["requests"])["actions"] == []


def test_find_schedule_reads_the_versions_of_one_schedule():
    state = FakeState(
        [
            row(T0, "a-0-1", sid=b"id:requests/x"),
            row(T0 + 9000, "a-0-2", sid=b"id:requests/y"),
            row(T0 + 5000, "a-0-3", sid=b"id:requests/x"),
        ]
    )
    state.strike("a-0-1")
    found, paused = find_schedule(state, b"id:requests/x")
    assert list(found["delivery_id"]) == ["a-0-3"] and paused.empty
    assert find_schedule(state, b"id:requests/z")[0].empty


def test_the_table_ends_with_the_next_page_token():
    state = FakeState([row(T0 + i, f"r-0-{i}", sid=f"id:requests/r{i}".encode()) for i in range(3)])
    found = list_schedules(
        state, ListFilters(), 2, None, T0 + 1, 5, view=lambda r: schedule_view(r, T0 + 1, ["requests"])
    )
    table = render_table(found)
    assert "as of batch 5" in table and "r0" in table and "(due already)" in table
    assert table.splitlines()[-1] == f"next page: --page-token {found.next_token}"
    assert render_table(list_schedules(state, ListFilters(), 5, None, T0, 5)).endswith("no more schedules")


def test_paused_crons_are_listed_apart_on_the_first_page_with_resume_and_cancel():
    state = FakeState([row(T0 + i, f"requests-0-{i}", sid=f"id:requests/r{i}".encode()) for i in range(3)])
    state.paused = [
        row(T0 + 60_000, "requests-0-7", sid=b"cron:requests/daily", topic="mails", cron_expr="0 9 * * *"),
        row(T0 - 5_000, "requests-0-8", sid=b"cron:requests/hourly", cron_expr="0 * * * *"),
    ]
    first = list_schedules(state, ListFilters(), 2, None, T0, 1, view=lambda r: schedule_view(r, T0, ["requests"]))
    assert [(s["id"], s["paused"], s["actions"]) for s in first.paused] == [
        ("hourly", True, ["CRON_RESUME", "CRON_CANCEL"]),
        ("daily", True, ["CRON_RESUME", "CRON_CANCEL"]),
    ]
    assert first.to_json()["paused"] == first.paused and [s["id"] for s in first.schedules] == ["r0", "r1"]
    assert "paused crons: 2" in render_table(first)
    later = list_schedules(state, ListFilters(), 2, decode_token(first.next_token, ListFilters()), T0, 1)
    assert later.paused == [] and len(later.schedules) == 1, "paused crons show on the first page only"
    for filters, ids in (
        (ListFilters(destination="mails"), ["daily"]),
        (ListFilters(kind="one-shot"), []),
        (ListFilters(id_prefix="hour"), ["hourly"]),
        (ListFilters(due_after_ms=T0), []),
    ):
        found = list_schedules(state, filters, 5, None, T0, 1, view=lambda r: schedule_view(r, T0, []))
        assert [s["id"] for s in found.paused] == ids, filters
    running, paused = find_schedule(state, b"cron:requests/daily", with_paused=True)
    assert running.empty and list(paused["delivery_id"]) == ["requests-0-7"]
    assert find_schedule(state, b"cron:requests/weekly", with_paused=True)[1].empty


def test_the_spans_of_bucket_keys_in_spark_sql_are_the_wheels(spark):
    """The reader's bucket ranges are computed by Spark from the state's keys (CheckpointState): one-second keys and
    the coarse keys of every level give the spans engine/rules/buckets.py gives them."""
    keys = [T0 // BUCKET_MS, T0 // BUCKET_MS + 1, 0, -5] + [
        int(key_at(level, T0 + offset))
        for level in range(1, COARSE_LEVELS + 1)
        for offset in (0, 1, level_width(level) - 1, 5 * level_width(level) + 3)
    ]
    first, last = span_sql("bucket")
    rows = (
        spark.createDataFrame([(k,) for k in keys], "bucket long")
        .selectExpr("bucket", f"{first} AS first", f"{last} AS last")
        .collect()
    )
    in_seconds = {k: (bucket_span_ms(k)[0] // BUCKET_MS, bucket_span_ms(k)[1] // BUCKET_MS - 1) for k in keys}
    assert {r["bucket"]: (r["first"], r["last"]) for r in rows} == in_seconds
    assert len(set(in_seconds.values())) == len(set(keys))
