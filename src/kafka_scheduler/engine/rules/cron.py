"""Cron expressions: validation, the minimum interval, and firing instants in a time zone. Spark-free.

Expressions are croniter's, as Kaspr reads them: five fields, or six with the seconds *last*
(``* * * * * */5`` is every 5 seconds), croniter's ``@hourly``-style aliases, and whatever else
``croniter.is_valid`` accepts.

Time zones (IANA names, ``zoneinfo``) follow EventBridge Scheduler's rules for daylight saving:

* croniter walks the *local wall clock* (naive datetimes: plain calendar arithmetic, no zone);
* a local time that does not exist (the hour skipped when clocks go forward) is skipped;
* a local time that exists twice (the hour repeated when clocks go back) fires once, at its first
  occurrence; the second pass of that hour fires nothing.

So a ``30 2 * * *`` cron in Europe/Paris does not fire on the spring-forward day, and fires once, at
the first 02:30, on the fall-back day. Without a zone, UTC (no daylight saving).

The client checks a cron before sending it with ``problem``, as the job will: this module needs croniter (a
dependency of the client install too), and numpy only for ``next_firings``, the job's.

Next firings are computed for many crons at once (``next_firings``): crons with the same expression,
zone and previous firing share one croniter call, so a million crons firing at the same instant cost
one call, not a million.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

if TYPE_CHECKING:
    import numpy as np

_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)
# Instants from which the minimum interval is measured (first MIN_INTERVAL_FIRINGS firings after each): the starts
# of a leap year, of a leap day and of a common year's end of February, where calendar fields wrap.
_PROBES = (datetime(2000, 1, 1), datetime(2000, 2, 28, 23), datetime(2001, 2, 28, 23), datetime(2001, 12, 31, 23))
MIN_INTERVAL_FIRINGS = 1000
MIN_INTERVAL_HORIZON_MS = 400 * 86_400_000  # and within 400 days of each


class CronError(ValueError):
    """An expression or time zone the scheduler cannot use; the message is the rejection reason."""


def naive_ms(moment: datetime) -> int:
    """Epoch milliseconds of a naive datetime read as UTC."""
    return (moment - _EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=int(ms))


@lru_cache(maxsize=1024)
def zone(name: str | None) -> ZoneInfo | None:
    """The zone of an IANA name (None: UTC). Raises CronError for a name zoneinfo does not know."""
    if name is None or name in ("UTC", "Etc/UTC"):
        return None
    try:
        return ZoneInfo(name)
    except Exception:  # ZoneInfoNotFoundError, ValueError for paths and odd keys
        raise CronError(f"unknown time zone '{name}' (expected an IANA name like Europe/Paris)") from None


def local_to_utc_ms(local: datetime, tz: ZoneInfo | None) -> int | None:
    """The UTC instant of a local wall-clock time: its first occurrence when it exists twice, None when it does
    not exist (skipped by a forward jump of the clocks)."""
    if tz is None:
        return naive_ms(local)
    utc = local.replace(tzinfo=tz, fold=0).astimezone(UTC).replace(tzinfo=None)
    back = (utc.replace(tzinfo=UTC).astimezone(tz)).replace(tzinfo=None)
    if back != local:
        return None
    return naive_ms(utc)


def utc_to_local(ms: int, tz: ZoneInfo | None) -> datetime:
    moment = from_ms(ms)
    if tz is None:
        return moment
    return moment.replace(tzinfo=UTC).astimezone(tz).replace(tzinfo=None)


class CronSpec:
    """A validated expression in a zone. ``next_after`` gives firing instants in UTC epoch milliseconds."""

    def __init__(self, expr: str, tz_name: str | None = None):
        from croniter import croniter

        self.expr, self.tz_name = expr, tz_name
        self.tz = zone(tz_name)
        if expr is None or not expr.strip() or not croniter.is_valid(expr):
            raise CronError(
                f"invalid {_header()} '{expr}' (expected a cron expression like '*/5 * * * *', "
                "or six fields with the seconds last, like '* * * * * */5')"
            )
        self._iter = croniter(expr, datetime(2000, 1, 1))
        self._lock = threading.Lock()  # a croniter is stateful; one spec serves every shard of a worker
        self._min_interval_ms: int | None = None

    def _local_next(self, after: datetime) -> datetime:
        with self._lock:
            self._iter.set_current(after, force=True)
            return self._iter.get_next(datetime)

    def _measure_min_interval(self) -> int:
        from croniter import croniter

        smallest = None
        for probe in _PROBES:
            it = croniter(self.expr, probe)
            horizon = naive_ms(probe) + MIN_INTERVAL_HORIZON_MS
            previous = naive_ms(it.get_next(datetime))
            for _ in range(MIN_INTERVAL_FIRINGS):
                if previous > horizon:
                    break
                current = naive_ms(it.get_next(datetime))
                gap = current - previous
                smallest = gap if smallest is None else min(smallest, gap)
                previous = current
        return smallest

    @property
    def min_interval_ms(self) -> int:
        """The smallest gap between consecutive firings (measured over the first firings after a few instants where
        calendar fields wrap; daylight saving only ever widens gaps: a skipped local time does not fire, a repeated
        one fires once). Raises CronError for an expression that never fires (e.g. '0 0 30 2 *')."""
        if self._min_interval_ms is None:
            try:
                self._min_interval_ms = self._measure_min_interval()
            except Exception:  # CroniterBadDateError
                raise CronError(f"invalid {_header()} '{self.expr}': it never fires") from None
        return self._min_interval_ms

    def next_after(self, after_ms: int) -> int | None:
        """The first firing strictly after ``after_ms`` (UTC epoch ms); None if there is none (croniter finds no
        date within its search range)."""
        local = utc_to_local(after_ms, self.tz)
        try:
            while True:
                candidate = self._local_next(local)
                instant = local_to_utc_ms(candidate, self.tz)
                if instant is not None and instant > after_ms:
                    return instant
                local = candidate  # skipped (does not exist), or the first pass of a repeated hour already gone
        except Exception as exc:
            if type(exc).__name__.startswith("Croniter"):
                return None
            raise


def _header() -> str:
    from ...protocol import CRON_EXPR

    return CRON_EXPR


_SPECS: dict = {}  # (expr, zone) -> CronSpec, or the CronError it raised
_SPECS_LOCK = threading.Lock()


def spec(expr: str, tz_name: str | None = None) -> CronSpec:
    """A cached CronSpec (croniter parses an expression in ~0.7 ms). Raises CronError."""
    key = (expr, tz_name)
    found = _SPECS.get(key)
    if found is None:
        try:
            found = CronSpec(expr, tz_name)
        except CronError as exc:
            found = exc
        with _SPECS_LOCK:
            if len(_SPECS) > 10_000:
                _SPECS.clear()
            _SPECS[key] = found
    if isinstance(found, CronError):
        raise found
    return found


def problem(expr: str, tz_name: str | None, min_interval_ms: int) -> str | None:
    """Why a cron definition is rejected, or None: an invalid expression, an unknown zone, firings closer together
    than ``min_interval_ms``."""
    try:
        found = spec(expr, tz_name)
        interval = found.min_interval_ms
    except CronError as exc:
        return str(exc)
    if interval < min_interval_ms:
        return (
            f"{_header()} '{expr}' fires every {format_ms(interval)} at times, more often than "
            f"the minimum interval {format_ms(min_interval_ms)} (--cron-min-interval)"
        )
    return None


def format_ms(ms: int) -> str:
    if ms % 1000 == 0:
        return f"{ms // 1000}s"
    return f"{ms}ms"


def first_firing(
    expr: str, tz_name: str | None, after_ms: int, start_ms: int | None = None, end_ms: int | None = None
) -> int | None:
    """The first firing after ``after_ms`` and at or after ``start_ms``; None if there is none by ``end_ms``."""
    if start_ms is not None:
        after_ms = max(after_ms, start_ms - 1)
    instant = spec(expr, tz_name).next_after(after_ms)
    if instant is None or (end_ms is not None and instant > end_ms):
        return None
    return instant


def next_firings(exprs, tzs, after_ms) -> np.ndarray:
    """The next firing after each ``after_ms[i]`` of cron (``exprs[i]``, ``tzs[i]``), as int64 (-1: none). Rows
    sharing expression, zone and instant share one computation."""
    import numpy as np  # here, not at the top: the client checks crons with this module and has no numpy

    count = len(after_ms)
    out = np.full(count, -1, dtype=np.int64)
    if not count:
        return out
    groups: dict = {}
    for i, key in enumerate(zip(exprs, tzs, (int(a) for a in after_ms))):
        groups.setdefault(key, []).append(i)
    for (expr, tz_name, after), rows in groups.items():
        instant = spec(expr, None if _missing(tz_name) else tz_name).next_after(after)
        if instant is not None:
            out[rows] = instant
    return out


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)
