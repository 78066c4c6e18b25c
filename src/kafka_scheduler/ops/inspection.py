"""Pending schedules read straight from a checkpoint (``kafka-scheduler inspect``), whether the job runs or not.

Spark's state data source (format ``statestore``) reads the state of the last committed batch: the wheel's
``chunks`` (Arrow blobs of schedules, wheel_processor.py) less the versions its ``strikes`` took out (replaced
or cancelled since the chunk was written). A schedule written at its due time stays in a chunk until a later
batch retires it, so schedules due before the last committed batch are counted apart ("due, not yet
retired"): delivered or about to be.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator, Optional

import pandas as pd

from ..protocol import CLIENT_SID_PREFIX
from ..engine.wheel_processor import from_blob

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@dataclass
class Filters:
    ids: tuple[str, ...] = ()  # request ids (the text after the input topic); any of them
    destination: Optional[str] = None
    input_topic: Optional[str] = None
    due_from_ms: Optional[int] = None
    due_until_ms: Optional[int] = None  # exclusive

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
    batch: Optional[int]
    matching: int = 0
    overdue: int = 0  # due before as_of_ms: written or about to be, until a batch retires them
    per_hour: Counter = field(default_factory=Counter)  # start of hour (ms) -> schedules due in it
    per_day: Counter = field(default_factory=Counter)
    schedules: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"as_of": _iso(self.as_of_ms), "batch": self.batch, "matching": self.matching,
                "due_not_retired": self.overdue,
                "per_hour": {_iso(h): n for h, n in sorted(self.per_hour.items())},
                "per_day": {_iso(d)[:10]: n for d, n in sorted(self.per_day.items())},
                "schedules": self.schedules}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(data) -> Optional[str]:
    if data is None:
        return None
    data = bytes(data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "0x" + data.hex()


def _request_id(sid) -> Optional[str]:
    """The request id of a client schedule id (b"id:<topic>/<id>"); None for schedules sent without one."""
    if sid is None or (isinstance(sid, float) and pd.isna(sid)):
        return None
    sid = bytes(sid)
    if not sid.startswith(CLIENT_SID_PREFIX):
        return None
    return _text(sid[len(CLIENT_SID_PREFIX):].split(b"/", 1)[1])


def _input_topic(delivery_id: str) -> str:
    return delivery_id.rsplit("-", 2)[0]


def schedule_view(row) -> dict:
    """One schedule in full, as JSON-ready values."""
    headers = [{"key": h["key"], "value": _text(h["value"])} for h in (row["headers"] if row["headers"] is not None
                                                                       else [])]
    view = {"id": row["id"], "due": _iso(int(row["due_ms"])), "due_ms": int(row["due_ms"]), "destination": row["topic"],
            "input_topic": row["input_topic"], "delivery_id": row["delivery_id"], "key": _text(row["key"]),
            "value": _text(row["value"]), "headers": headers}
    if not pd.isna(row["partition"]):
        view["partition"] = int(row["partition"])
    return view


def pending_frames(spark, checkpoint_dir: str, named: bool = True) -> Iterator[pd.DataFrame]:
    """Pending schedules, a chunk at a time: the entry columns plus (``named``) ``id`` and ``input_topic``, which
    cost a Python call per schedule, so a count leaves them out."""
    from pyspark.sql import functions as F

    def state(name: str):
        return spark.read.format("statestore").option("stateVarName", name).load(checkpoint_dir)

    struck: dict[tuple[int, int], set] = {}
    for row in state("strikes").select(F.col("key.shard").alias("shard"), F.col("user_map_key.bucket").alias(
            "bucket"), F.col("user_map_value.delivery_ids").alias("ids")).toLocalIterator():
        struck.setdefault((row["shard"], row["bucket"]), set()).update(row["ids"] or ())
    chunks = state("chunks").select(F.col("key.shard").alias("shard"), F.col("user_map_key.bucket").alias("bucket"),
                                    F.col("user_map_value.data").alias("data"))
    for row in chunks.toLocalIterator():
        frame = from_blob(row["data"])
        gone = struck.get((row["shard"], row["bucket"]))
        if gone:
            frame = frame[~frame["delivery_id"].isin(gone)]
        if not len(frame):
            continue
        if not named:
            yield frame
            continue
        frame = frame.assign(id=[_request_id(s) for s in frame["sid"]],
                             input_topic=[_input_topic(d) for d in frame["delivery_id"]])
        yield frame


def inspect_checkpoint(spark, checkpoint_dir: str, filters: Filters, as_of_ms: int, batch: Optional[int],
                       limit: int = 20) -> Inspection:
    found = Inspection(as_of_ms, batch)
    shown: list[pd.DataFrame] = []
    for frame in pending_frames(spark, checkpoint_dir):
        frame = filters.keep(frame)
        if not len(frame):
            continue
        due = frame["due_ms"].astype("int64")
        found.matching += len(frame)
        found.overdue += int((due < as_of_ms).sum())
        found.per_hour.update(Counter((due // HOUR_MS * HOUR_MS).tolist()))
        found.per_day.update(Counter((due // DAY_MS * DAY_MS).tolist()))
        shown.append(_earliest(frame, limit))
        if sum(len(f) for f in shown) > 4 * limit:  # keep memory bounded: only the earliest ``limit`` are shown
            shown = [_earliest(pd.concat(shown), limit)]
    if shown and limit:
        earliest = _earliest(pd.concat(shown), limit)
        found.schedules = [schedule_view(row) for _, row in earliest.iterrows()]
    return found


def _earliest(frame: pd.DataFrame, limit: int) -> pd.DataFrame:
    return frame.sort_values(["due_ms", "delivery_id"]).head(limit)


def render_table(found: Inspection, filters: Filters) -> str:
    """The inspection as text: totals, counts per hour (next 48 hours) and per day (next 30 days), schedules."""
    lines = [f"pending schedules in the checkpoint as of batch {found.batch} (read {_iso(found.as_of_ms)}): "
             f"{found.matching:,} matching" + (f", {found.overdue:,} of them due already (delivered or about to be, "
                                              "until a batch retires them)" if found.overdue else "")]
    start_hour = found.as_of_ms // HOUR_MS * HOUR_MS
    hours = [(h, n) for h, n in sorted(found.per_hour.items()) if start_hour <= h < start_hour + 48 * HOUR_MS]
    if hours:
        lines += ["", "due per hour, next 48 hours (UTC):"]
        lines += [f"  {_iso(h)[:13].replace('T', ' ')}:00  {n:>10,}" for h, n in hours]
    start_day = found.as_of_ms // DAY_MS * DAY_MS
    days = [(d, n) for d, n in sorted(found.per_day.items()) if start_day <= d < start_day + 30 * DAY_MS]
    if days:
        lines += ["", "due per day, next 30 days (UTC):"]
        lines += [f"  {_iso(d)[:10]}  {n:>10,}" for d, n in days]
    later = sum(n for d, n in found.per_day.items() if d >= start_day + 30 * DAY_MS)
    if later:
        lines.append(f"  later       {later:>10,}")
    if found.schedules:
        whole = len(filters.ids) > 0 and len(found.schedules) <= len(filters.ids)
        lines += ["", "schedules" + ("" if whole else f" (the {len(found.schedules)} due first)") + ":"]
        for view in found.schedules:
            lines.append(f"  {view['due']}  id {view['id'] if view['id'] is not None else '(none)'}  -> "
                         f"{view['destination']}  (from {view['input_topic']}, delivery id {view['delivery_id']})")
            if whole:
                lines.append(f"      key {view['key']!r}  value {view['value']!r}")
                for header in view["headers"]:
                    lines.append(f"      header {header['key']}: {header['value']!r}")
    elif filters.ids:
        lines.append(f"no pending schedule with id {', '.join(filters.ids)}")
    return "\n".join(lines)


def render_json(found: Inspection) -> str:
    return json.dumps(found.to_json(), indent=2)
