"""Cron firings (engine/rules/cron.py) against an independent reference: plain zoneinfo arithmetic that walks the local
wall clock day by day, matches each local time against the expression with a small matcher of its own, and applies
the daylight-saving rules (a local time that does not exist is skipped; one that exists twice fires once, at its
first occurrence). No croniter in the reference."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kafka_scheduler.engine.rules import cron

# Zones with every kind of transition: an hour at 02:00 (Paris, New York), at midnight (Sao Paulo's DST years:
# local midnight does not exist), 30 minutes (Lord Howe), two hours (Troll), a 45-minute offset (Chatham),
# negative DST years and Ramadan switches (Casablanca), a skipped day (Apia, 2011), none (Kolkata, UTC).
ZONES = [
    "Europe/Paris",
    "America/New_York",
    "America/Sao_Paulo",
    "Australia/Lord_Howe",
    "Antarctica/Troll",
    "Pacific/Chatham",
    "Africa/Casablanca",
    "Pacific/Apia",
    "America/St_Johns",
    "Asia/Kolkata",
    "Europe/London",
    "America/Havana",
    None,
]
YEARS = (2010, 2030)


# ---------------------------------------------------------------- the reference


def _field(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_text = part.split("/")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            first, last = (int(x) for x in part.split("-"))
        else:
            first = last = int(part)
            if step != 1:
                last = high
        values.update(range(first, last + 1, step))
    return values


def parse(expr: str):
    """(seconds, minutes, hours, days of month, months, days of week, dom restricted, dow restricted): the subset
    of croniter's syntax the tests generate (numbers, ranges, steps, lists, '*'), seconds as the sixth field."""
    fields = expr.split()
    minute, hour, dom, month, dow = fields[:5]
    second = fields[5] if len(fields) == 6 else "0"
    dows = {d % 7 for d in _field(dow, 0, 7)}
    return (
        sorted(_field(second, 0, 59)),
        sorted(_field(minute, 0, 59)),
        sorted(_field(hour, 0, 23)),
        _field(dom, 1, 31),
        _field(month, 1, 12),
        dows,
        dom != "*",
        dow != "*",
    )


def _day_matches(day: datetime, fields) -> bool:
    _, _, _, doms, months, dows, dom_set, dow_set = fields
    if day.month not in months:
        return False
    in_dom, in_dow = day.day in doms, (day.weekday() + 1) % 7 in dows
    if dom_set and dow_set:
        return in_dom or in_dow  # Vixie cron (croniter's day_or): either restriction
    return in_dom and in_dow


def _epoch_ms(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def occurrences(local: datetime, tz) -> list[int]:
    """Every UTC instant (ms) whose local wall-clock time is ``local``: none, one, or two in a repeated hour. Found
    by trying each offset the zone has around that time and keeping those that read back as ``local``."""
    if tz is None:
        return [_epoch_ms(local.replace(tzinfo=UTC))]
    offsets = {tz.utcoffset(local + timedelta(hours=h)) for h in (-26, -3, -1, 0, 1, 3, 26)}
    found = set()
    for offset in offsets:
        instant = local.replace(tzinfo=UTC) - offset
        if datetime.fromtimestamp(instant.timestamp(), tz).replace(tzinfo=None) == local:
            found.add(_epoch_ms(instant))
    return sorted(found)


def reference_next(expr: str, tz_name, after_ms: int):
    tz = None if tz_name is None else ZoneInfo(tz_name)
    fields = parse(expr)
    seconds, minutes, hours = fields[:3]
    start = datetime.fromtimestamp(after_ms / 1000, tz or UTC).replace(tzinfo=None)
    day = datetime(start.year, start.month, start.day) - timedelta(days=1)
    for _ in range(9 * 366):  # a 29 February comes every 4 years (8 around 2100)
        if _day_matches(day, fields):
            for h in hours:
                for m in minutes:
                    for s in seconds:
                        local = day.replace(hour=h, minute=m, second=s)
                        if local < start - timedelta(hours=3):
                            continue
                        found = occurrences(local, tz)
                        if found and found[0] > after_ms:  # the first occurrence only
                            return found[0]
        day += timedelta(days=1)
    return None


# ---------------------------------------------------------------- generated expressions and instants


def _part(low: int, high: int):
    single = st.integers(low, high).map(str)
    # (a degenerate range a-a is left out: croniter reads '0-0' in the hour field as every hour)
    ranged = st.tuples(st.integers(low, high - 1), st.integers(1, high - low)).map(
        lambda ab: f"{ab[0]}-{min(high, ab[0] + ab[1])}"
    )
    stepped = st.tuples(st.sampled_from(["*", str(low)]), st.integers(2, max(2, (high - low) // 2))).map(
        lambda a: f"{a[0]}/{a[1]}"
    )
    listed = st.lists(st.integers(low, high), min_size=2, max_size=4, unique=True).map(
        lambda xs: ",".join(map(str, sorted(xs)))
    )
    return st.one_of(st.just("*"), single, ranged, stepped, listed)


EXPRESSIONS = st.one_of(
    st.tuples(_part(0, 59), _part(0, 23), st.just("*"), st.just("*"), st.just("*")).map(" ".join),
    st.tuples(_part(0, 59), _part(0, 23), _part(1, 31), _part(1, 12), st.sampled_from(["*", "1-5", "0,6", "3"])).map(
        " ".join
    ),
    # six fields, seconds last; coarse seconds so the minimum interval holds
    st.tuples(
        _part(0, 59),
        _part(0, 23),
        st.just("*"),
        st.just("*"),
        st.just("*"),
        st.sampled_from(["0", "30", "*/15", "10,40", "0-50/25"]),
    ).map(" ".join),
)


@cache
def transitions(tz_name: str) -> list[int]:
    """The instants (ms) where the zone's offset changes between YEARS, found hour by hour and then to the second."""
    tz = ZoneInfo(tz_name)
    out = []
    moment = datetime(YEARS[0], 1, 1, tzinfo=UTC)
    end = datetime(YEARS[1], 12, 31, tzinfo=UTC)
    previous = moment.astimezone(tz).utcoffset()
    while moment < end:
        following = moment + timedelta(hours=1)
        offset = following.astimezone(tz).utcoffset()
        if offset != previous:
            low, high = moment, following
            while high - low > timedelta(seconds=1):
                middle = low + (high - low) / 2
                if middle.astimezone(tz).utcoffset() == previous:
                    low = middle
                else:
                    high = middle
            out.append(_epoch_ms(high))
            previous = offset
        moment = following
    return out


@st.composite
def near_a_transition(draw):
    tz_name = draw(st.sampled_from([z for z in ZONES if z is not None and transitions(z)]))
    instant = draw(st.sampled_from(transitions(tz_name)))
    return tz_name, instant + draw(st.integers(-30 * 3_600_000, 6 * 3_600_000))


ANY_INSTANT = st.tuples(
    st.sampled_from(ZONES),
    st.integers(_epoch_ms(datetime(YEARS[0], 1, 1, tzinfo=UTC)), _epoch_ms(datetime(YEARS[1], 1, 1, tzinfo=UTC))),
)


@settings(max_examples=300, deadline=None)
@given(expr=EXPRESSIONS, where=st.one_of(near_a_transition(), ANY_INSTANT))
@example(expr="* * 29-30 2 *", where=("Europe/Paris", 1_709_247_540_000))  # the next 29 February, 4 years on
def test_next_firing_matches_the_reference_over_zones_and_dst_transitions(expr, where):
    tz_name, after = where
    spec = cron.spec(expr, tz_name)
    expected = reference_next(expr, tz_name, after)
    assert spec.next_after(after) == expected, (expr, tz_name, cron.from_ms(after))


@settings(max_examples=60, deadline=None)
@given(expr=EXPRESSIONS, where=near_a_transition())
def test_a_run_of_firings_across_a_transition_matches_the_reference(expr, where):
    """Ten firings in a row: each one's successor, as the job chains them."""
    tz_name, instant = where
    spec = cron.spec(expr, tz_name)
    for _ in range(10):
        expected = reference_next(expr, tz_name, instant)
        got = spec.next_after(instant)
        assert got == expected, (expr, tz_name, cron.from_ms(instant))
        if got is None:
            break
        instant = got


def paris_ms(*fields, fold=0) -> int:
    return _epoch_ms(datetime(*fields, tzinfo=ZoneInfo("Europe/Paris"), fold=fold))


def test_spring_forward_skips_the_local_time_that_does_not_exist():
    spec = cron.spec("30 2 * * *", "Europe/Paris")
    # 2026-03-29: 02:00 -> 03:00 in Paris. 02:30 does not exist that day.
    assert spec.next_after(paris_ms(2026, 3, 28, 12)) == paris_ms(2026, 3, 30, 2, 30)
    every_20 = cron.spec("*/20 * * * *", "Europe/Paris")
    assert every_20.next_after(paris_ms(2026, 3, 29, 1, 50)) == paris_ms(2026, 3, 29, 3, 0)


def test_the_repeated_hour_fires_once_at_its_first_occurrence():
    spec = cron.spec("30 2 * * *", "Europe/Paris")
    # 2026-10-25: 03:00 -> 02:00 in Paris; 02:30 happens twice. It fires at the first (CEST, 00:30 UTC).
    first = spec.next_after(paris_ms(2026, 10, 24, 12))
    assert first == paris_ms(2026, 10, 25, 2, 30, fold=0) == _epoch_ms(datetime(2026, 10, 25, 0, 30, tzinfo=UTC))
    assert spec.next_after(first) == paris_ms(2026, 10, 26, 2, 30)
    every_20 = cron.spec("*/20 * * * *", "Europe/Paris")
    fired = [every_20.next_after(paris_ms(2026, 10, 25, 1, 50))]
    while len(fired) < 6:
        fired.append(every_20.next_after(fired[-1]))
    utc = [datetime.fromtimestamp(t / 1000, UTC).strftime("%H:%M") for t in fired]
    # 02:00, 02:20, 02:40 CEST (00:00-00:40 UTC); the second pass (01:00-01:40 UTC) fires nothing; 03:00 CET.
    assert utc == ["00:00", "00:20", "00:40", "02:00", "02:20", "02:40"]


def test_six_fields_have_the_seconds_last_and_aliases_work():
    assert cron.spec("* * * * * */5").min_interval_ms == 5000
    start = _epoch_ms(datetime(2026, 1, 1, tzinfo=UTC))
    assert cron.spec("* * * * * */5").next_after(start) == start + 5000
    assert cron.spec("@hourly").next_after(start) == start + 3_600_000


def test_aliases_and_zones_of_the_daily_alias():
    start = _epoch_ms(datetime(2026, 1, 1, tzinfo=UTC))
    # Kolkata is UTC+05:30: local midnight of Jan 2 is 18:30 UTC on Jan 1.
    assert cron.spec("@daily", "Asia/Kolkata").next_after(start) == start + (18 * 60 + 30) * 60_000
    assert cron.spec("@weekly").next_after(start) == _epoch_ms(datetime(2026, 1, 4, tzinfo=UTC))


@pytest.mark.parametrize(
    "expr, reason",
    [
        ("", "invalid x-scheduler-cron-expr"),
        ("* * * *", "invalid x-scheduler-cron-expr"),
        ("* * * * * 70", "invalid x-scheduler-cron-expr"),
        ("*/0 * * * *", "invalid x-scheduler-cron-expr"),
        ("@reboot", "invalid x-scheduler-cron-expr"),
        ("0 0 30 2 *", "invalid x-scheduler-cron-expr '0 0 30 2 *': it never fires"),
        ("* * * * * */4", "fires every 4s at times, more often than the minimum interval 5s"),
        ("* * * * * 0,1", "fires every 1s"),
        ("0,59 * * * * 0,58", "fires every 2s"),  # across the minute: :58 then :00 of the next
    ],
)
def test_invalid_and_too_frequent_expressions_have_a_reason(expr, reason):
    assert reason in cron.problem(expr, None, 5000)


def test_valid_expressions_have_no_problem():
    for expr in ["* * * * *", "* * * * * */5", "@hourly", "0 9 * * 1-5", "*/5 * * * *", "0 0 29 2 *"]:
        assert cron.problem(expr, "Europe/Paris", 5000) is None, expr


def test_unknown_zones_are_refused():
    for name in ["Mars/Base", "", "../etc/passwd", "/etc/localtime", "Europe/"]:
        assert "unknown time zone" in cron.problem("* * * * *", name, 5000)


def test_next_firings_in_bulk_computes_once_per_expression_zone_and_instant(monkeypatch):
    calls = []
    original = cron.CronSpec.next_after

    def counted(self, after_ms):
        calls.append(after_ms)
        return original(self, after_ms)

    monkeypatch.setattr(cron.CronSpec, "next_after", counted)
    start = _epoch_ms(datetime(2026, 1, 1, tzinfo=UTC))
    n = 1_000_000
    out = cron.next_firings(
        np.full(n, "* * * * *", dtype=object), np.full(n, None, dtype=object), np.full(n, start, dtype=np.int64)
    )
    assert len(calls) == 1 and (out == start + 60_000).all()
    mixed = cron.next_firings(
        ["* * * * *", "* * * * *", "@hourly", "@hourly"],
        [None, "Asia/Kolkata", None, None],
        [start, start, start, start + 1],
    )
    assert list(mixed) == [start + 60_000, start + 60_000, start + 3_600_000, start + 3_600_000]
