"""Pending schedules read straight from a checkpoint (``kafka-scheduler inspect``), whether the job runs or not.

The engine's reader of the state (engine/spark/state_reader.py, Spark's state data source) gives the pending
schedules of the last committed batch, less the versions replaced or cancelled since they were written. A schedule
written at its due time stays in the state until a later batch retires it, so schedules due before the read are
counted apart ("due, not yet retired"): delivered or about to be.

A running cron is one pending schedule: its pending firing (``due_ms``, delivery id ``<activation>@<instant>``) with
its definition in the ``cron_*`` columns (``cron_expr`` not null); its later firings are computed (``FiringCounter``,
``next_firings``). A paused cron has no pending firing: the reader gives it apart, ``due_ms`` being where a replay
would resume.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from ..delivery_ids import request_of
from ..engine.rules import cron as crons
from ..engine.spark.state_reader import CheckpointState
from ..protocol import CLIENT_SID_PREFIX, CRON_SID_PREFIX

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass
class Filters:
    ids: tuple[str, ...] = ()  # request ids (the text after the input topic); any of them
    destination: str | None = None
    input_topic: str | None = None
    due_from_ms: int | None = None
    due_until_ms: int | None = None  # exclusive

    def keep(self, frame: pd.DataFrame) -> pd.DataFrame:
        mask = pd.Series(True, index=frame.index)
        if self.ids:
            mask &= frame["id"].isin(self.ids)
        if self.destination is not None:
            mask &= frame["topic"] == self.destination
        if self.input_topic is not None:
            mask &= frame["input_topic"] == self.input_topic
        if self.due_from_ms is not None:
            mask &= frame["due_ms"] >= self.due_from_ms
        if self.due_until_ms is not None:
            mask &= frame["due_ms"] < self.due_until_ms
        return frame[mask]


@dataclass
class Inspection:
    """What ``inspect`` found: counts of the matching schedules, and the first ``limit`` of them in full."""

    as_of_ms: int
    batch: int | None
    matching: int = 0
    overdue: int = 0  # due before as_of_ms: written or about to be, until a batch retires them
    per_hour: Counter = field(default_factory=Counter)  # start of hour (ms) -> deliveries due in it (a cron's
    per_day: Counter = field(default_factory=Counter)  # firings each, next 48 hours and 30 days)
    schedules: list = field(default_factory=list)
    crons: int = 0  # of the matching schedules, running crons (one pending firing each)
    paused: list = field(default_factory=list)  # matching paused crons (the first ``limit``), as schedule_view
    paused_count: int = 0
    firings_estimated_from_ms: int | None = None  # per-day counts of dense crons estimated from then on

    def to_json(self) -> dict:
        return {
            "as_of": iso_ms(self.as_of_ms),
            "batch": self.batch,
            "matching": self.matching,
            "due_not_retired": self.overdue,
            "crons": self.crons,
            "paused_crons": self.paused_count,
            "per_hour": {iso_ms(h): n for h, n in sorted(self.per_hour.items())},
            "per_day": {iso_ms(d)[:10]: n for d, n in sorted(self.per_day.items())},
            "firings_estimated_from": None
            if self.firings_estimated_from_ms is None
            else iso_ms(self.firings_estimated_from_ms)[:10],
            "schedules": self.schedules,
            "paused": self.paused,
        }


def iso_ms(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shown_text(data) -> str | None:
    if data is None:
        return None
    data = bytes(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()


def header_views(headers) -> list[dict]:
    """A schedule's headers as JSON-ready values: their keys, and their values as text (or hex)."""
    return [{"key": h["key"], "value": shown_text(h["value"])} for h in (headers if headers is not None else [])]


def request_id(sid) -> str | None:
    """The request id of a client schedule id (b"id:<topic>/<id>", or a cron's b"cron:<topic>/<id>"); None for
    schedules sent without one."""
    if sid is None or (isinstance(sid, float) and pd.isna(sid)):
        return None
    sid = bytes(sid)
    for prefix in (CLIENT_SID_PREFIX, CRON_SID_PREFIX):
        if sid.startswith(prefix):
            return shown_text(sid[len(prefix) :].split(b"/", 1)[1])
    return None


def _input_topic(delivery_id: str) -> str:
    return request_of(delivery_id)[0]


def schedule_view(row) -> dict:
    """One schedule in full, as JSON-ready values."""
    headers = header_views(row["headers"])
    view = {
        "id": row["id"],
        "due": iso_ms(int(row["due_ms"])),
        "due_ms": int(row["due_ms"]),
        "destination": row["topic"],
        "input_topic": row["input_topic"],
        "delivery_id": row["delivery_id"],
        "key": shown_text(row["key"]),
        "value": shown_text(row["value"]),
        "headers": headers,
    }
    if not pd.isna(row["partition"]):
        view["partition"] = int(row["partition"])
    lateness = row.get("max_lateness_ms")
    if lateness is not None and not pd.isna(lateness):
        view["max_lateness_ms"] = int(lateness)
    view.update(cron_view(row))
    return view


def cron_view(row) -> dict:
    """A cron's definition, for a row with one (else {}): ``kind`` "cron" (or "one-shot"), and for a paused one
    (``paused`` True) ``due`` is where a replay would resume."""
    expr = row.get("cron_expr")
    if _optional(expr) is None:
        return {"kind": "one-shot"}
    view = {
        "kind": "cron",
        "cron": {
            "expr": expr,
            "timezone": _optional(row.get("cron_tz")) or "UTC",
            "missed_fire_policy": _optional(row.get("cron_policy")) or "replay",
        },
    }
    for name in ("start", "end"):
        bound = _optional(row.get(f"cron_{name}_ms"))
        if bound is not None:
            view["cron"][f"{name}_at"] = iso_ms(int(bound))
    view["paused"] = bool(row.get("paused", False))
    return view


def _optional(value):
    """None for a missing cell: None, NaN, or pandas' NA (a nullable integer column's)."""
    if value is None or value is pd.NA or (isinstance(value, float) and pd.isna(value)):
        return None
    return value


def named(frame: pd.DataFrame, **extra) -> pd.DataFrame:
    """Entries with their request ``id`` and ``input_topic`` (a Python call per schedule: counts go without)."""
    return frame.assign(
        id=[request_id(s) for s in frame["sid"]], input_topic=[_input_topic(d) for d in frame["delivery_id"]], **extra
    )


# The most firings of one cron expression (and zone) the counts enumerate; beyond, per-day counts are estimated.
FIRINGS_COUNTED = 50_000


class FiringCounter:
    """The firings of running crons after their pending one (which counts as a schedule due at its time), per hour
    until ``hours_until_ms`` and per day until ``days_until_ms``: the status page's chart and ``inspect`` count each
    firing in its hour. Crons sharing expression and zone share one enumeration (one croniter call per firing,
    whatever the number of crons); an expression firing more than FIRINGS_COUNTED times within the horizon is
    enumerated that far and its later days estimated from its last whole day (``estimated_from_ms``)."""

    def __init__(self, as_of_ms: int, hours_until_ms: int, days_until_ms: int):
        self.as_of_ms, self.hours_until_ms, self.days_until_ms = as_of_ms, hours_until_ms, days_until_ms
        self.per_hour: Counter = Counter()
        self.per_day: Counter = Counter()
        self.estimated_from_ms: int | None = None
        self._sequences: dict = {}  # (expr, zone) -> (from_ms, firings as int64, capped)

    def _sequence(self, expr: str, tz: str | None, from_ms: int):
        known = self._sequences.get((expr, tz))
        if known is not None and known[0] <= from_ms:
            return known
        spec = crons.spec(expr, tz)
        out, instant, until = [], from_ms, max(self.hours_until_ms, self.days_until_ms)
        while len(out) < FIRINGS_COUNTED:
            instant = spec.next_after(instant)
            if instant is None or instant >= until:
                break
            out.append(instant)
        capped = len(out) >= FIRINGS_COUNTED
        known = self._sequences[(expr, tz)] = (from_ms, np.array(out, dtype=np.int64), capped)
        return known

    def add(self, frame: pd.DataFrame) -> None:
        if "cron_expr" not in frame:
            return
        running = frame[frame["cron_expr"].notna()]
        if not len(running):
            return
        ends = pd.to_numeric(running["cron_end_ms"], errors="coerce").fillna(float(2**62)).astype("int64")
        keys = pd.DataFrame(
            {
                "expr": running["cron_expr"],
                "tz": running["cron_tz"].where(running["cron_tz"].notna(), None),
                "due": running["due_ms"].astype("int64"),
                "end": ends,
            }
        )
        for (expr, tz, due, end), group in keys.groupby(["expr", "tz", "due", "end"], dropna=False, sort=False):
            tz = None if tz is None or (isinstance(tz, float) and pd.isna(tz)) else tz
            _, firings, capped = self._sequence(expr, tz, int(due))
            after = firings[np.searchsorted(firings, int(due), side="right") :]
            after = after[after <= int(end)]
            n = len(group)
            hours = after[after < self.hours_until_ms]
            for hour, count in zip(*np.unique(hours // HOUR_MS * HOUR_MS, return_counts=True)):
                self.per_hour[int(hour)] += int(count) * n
            days = after[after < self.days_until_ms]
            day_starts, day_counts = np.unique(days // DAY_MS * DAY_MS, return_counts=True)
            for day, count in zip(day_starts, day_counts):
                self.per_day[int(day)] += int(count) * n
            if capped and len(day_starts) >= 2:
                # Enumerated to its cap before the horizon: the days after the last whole one repeat it.
                per_day = int(day_counts[-2])
                partial = int(day_starts[-1])
                self.per_day[partial] += max(0, per_day - int(day_counts[-1])) * n
                end_day = min(int(end), self.days_until_ms - 1) // DAY_MS * DAY_MS
                for day in range(partial + DAY_MS, end_day + 1, DAY_MS):
                    self.per_day[day] += per_day * n
                self.estimated_from_ms = (
                    partial if self.estimated_from_ms is None else min(self.estimated_from_ms, partial)
                )


def inspect_checkpoint(
    spark, checkpoint_dir: str, filters: Filters, as_of_ms: int, batch: int | None, limit: int = 20
) -> Inspection:
    found = Inspection(as_of_ms, batch)
    firings = FiringCounter(
        as_of_ms, as_of_ms // HOUR_MS * HOUR_MS + 48 * HOUR_MS, as_of_ms // DAY_MS * DAY_MS + 30 * DAY_MS
    )
    shown: list[pd.DataFrame] = []
    state = CheckpointState(spark, checkpoint_dir, batch)
    buckets, paused = state.buckets(filters.due_from_ms, filters.due_until_ms, with_paused=True)
    for _, frame in state.pending(buckets):
        if not len(frame):
            continue
        frame = filters.keep(named(frame))
        if not len(frame):
            continue
        due = frame["due_ms"].astype("int64")
        found.matching += len(frame)
        found.overdue += int((due < as_of_ms).sum())
        found.crons += int(frame["cron_expr"].notna().sum())
        found.per_hour.update(Counter((due // HOUR_MS * HOUR_MS).tolist()))
        found.per_day.update(Counter((due // DAY_MS * DAY_MS).tolist()))
        firings.add(frame)
        shown.append(_earliest(frame, limit))
        if sum(len(f) for f in shown) > 4 * limit:  # keep memory bounded: only the earliest ``limit`` are shown
            shown = [_earliest(pd.concat(shown), limit)]
    found.per_hour.update(firings.per_hour)
    found.per_day.update(firings.per_day)
    found.firings_estimated_from_ms = firings.estimated_from_ms
    if shown and limit:
        earliest = _earliest(pd.concat(shown), limit)
        found.schedules = [schedule_view(row) for _, row in earliest.iterrows()]
    for frame in paused:
        frame = filters.keep(named(frame, paused=True))
        found.paused_count += len(frame)
        found.paused += [schedule_view(row) for _, row in frame.iterrows()][: max(0, limit - len(found.paused))]
    return found


def _earliest(frame: pd.DataFrame, limit: int) -> pd.DataFrame:
    return frame.sort_values(["due_ms", "delivery_id"]).head(limit)


def render_table(found: Inspection, filters: Filters) -> str:
    """The inspection as text: totals, counts per hour (next 48 hours) and per day (next 30 days), schedules."""
    lines = [
        f"pending schedules in the checkpoint as of batch {found.batch} (read {iso_ms(found.as_of_ms)}): "
        f"{found.matching:,} matching"
        + (
            f", {found.overdue:,} of them due already (delivered or about to be, until a batch retires them)"
            if found.overdue
            else ""
        )
    ]
    start_hour = found.as_of_ms // HOUR_MS * HOUR_MS
    hours = [(h, n) for h, n in sorted(found.per_hour.items()) if start_hour <= h < start_hour + 48 * HOUR_MS]
    if hours:
        lines += ["", "due per hour, next 48 hours (UTC):"]
        lines += [f"  {iso_ms(h)[:13].replace('T', ' ')}:00  {n:>10,}" for h, n in hours]
    start_day = found.as_of_ms // DAY_MS * DAY_MS
    days = [(d, n) for d, n in sorted(found.per_day.items()) if start_day <= d < start_day + 30 * DAY_MS]
    if days:
        lines += ["", "due per day, next 30 days (UTC):"]
        lines += [f"  {iso_ms(d)[:10]}  {n:>10,}" for d, n in days]
    later = sum(n for d, n in found.per_day.items() if d >= start_day + 30 * DAY_MS)
    if later:
        lines.append(f"  later       {later:>10,}")
    if found.crons or found.paused_count:
        lines += [
            "",
            f"recurring: {found.crons:,} running crons (each counted above at every firing in the next 30 "
            f"days), {found.paused_count:,} paused",
        ]
        if found.firings_estimated_from_ms is not None:
            lines.append(
                f"  (firings per day estimated from {iso_ms(found.firings_estimated_from_ms)[:10]} on: more "
                f"than {FIRINGS_COUNTED:,} firings of one expression)"
            )
    if found.schedules:
        whole = len(filters.ids) > 0 and len(found.schedules) <= len(filters.ids)
        lines += ["", "schedules" + ("" if whole else f" (the {len(found.schedules)} due first)") + ":"]
        for view in found.schedules:
            lines.append(
                f"  {view['due']}  id {view['id'] if view['id'] is not None else '(none)'}  -> "
                f"{view['destination']}  (from {view['input_topic']}, delivery id {view['delivery_id']})"
                + _cron_text(view)
            )
            if whole:
                lines.append(f"      key {view['key']!r}  value {view['value']!r}")
                for header in view["headers"]:
                    lines.append(f"      header {header['key']}: {header['value']!r}")
    elif filters.ids and not found.paused:
        lines.append(f"no pending schedule with id {', '.join(filters.ids)}")
    if found.paused:
        lines += ["", "paused crons:"]
        for view in found.paused:
            lines.append(
                f"  id {view['id']}  -> {view['destination']}{_cron_text(view)}; a replay resumes at {view['due']}"
            )
    return "\n".join(lines)


def _cron_text(view: dict) -> str:
    if view.get("kind") != "cron":
        return ""
    c = view["cron"]
    bounds = "".join(f", {name.replace('_', ' ')} {c[name]}" for name in ("start_at", "end_at") if name in c)
    return f"  [cron '{c['expr']}' {c['timezone']}, {c['missed_fire_policy']}{bounds}]"


def render_json(found: Inspection) -> str:
    return json.dumps(found.to_json(), indent=2)
