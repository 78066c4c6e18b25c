"""Pending schedules a page at a time: ``kafka-scheduler list`` and ``GET /api/schedules`` without ``id``.

Read from the checkpoint with Spark's state data source, like ``inspect``, on request only (never in a batch), and
all reads of one page pinned to one committed batch (the source's ``batchId``), so a page is one consistent state.

**Order and paging.** Schedules are listed by (due time, delivery id): a total order on keys that never change for a
schedule version. A page's continuation token is the key of its last schedule, the batch it was read from and a
fingerprint of the filters (base64url of JSON: opaque to clients, who pass it back as they got it). The next page
reads the *newest* committed batch and lists what comes after that key (keyset paging), so state may move on between
pages, and then: no schedule is listed twice; one that stays pending with the same due time through the whole
listing is listed exactly once; one added, or replaced (a new version, a new key) during it shows if its key falls
after the pages already read; one cancelled or delivered meanwhile is not shown any more. The answer says when the
state moved on (``continued_from_batch`` differs from ``batch``). A token given with other filters, or damaged, is
refused (``BadPageToken``: a 400, or exit 2).

**Cost.** The state store is keyed by (shard, time bucket): a bucket holds one second, or, far ahead, a coarse span
of 64ᴸ seconds (engine/rules/buckets.py, "Coarse levels"); the spans of a shard's buckets never overlap, so buckets are
read in the order of the seconds they span. A page reads the distinct buckets from the first wanted one on (a small
Spark job that ships bucket numbers only), then the chunks and strikes of the first few of them, and widens (16, then
256 buckets, then all the rest) only while fewer than ``limit`` + 1 schedules matched. Chunks are decoded one at a time
and only the ``limit`` + 1 first schedules are kept, so a page holds a few chunks in memory, not the state. Filters
on the due time narrow the buckets read; the others (destination, id prefix, kind) are applied to each chunk.

**Kinds.** A schedule id (``sid``) of ``cron:`` names a recurring schedule: its row is the cron's next firing, and its
``cron_*`` columns (the cron's definition, written by the cron engine) are shown under ``cron`` as ``inspect`` shows
them. Anything else is a
one-shot (with a request id, ``id:``, or without, ``offset:``). A paused cron has no pending firing: it is kept in a
state variable of its own (few rows), listed apart (``paused``) on the first page of a listing without due-time
filters, with the page's Resume and Cancel.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC
from typing import Protocol

import pandas as pd

from ..engine.rules.buckets import BUCKET_MS, COARSE_BASE, COARSE_MIN, LEVEL_FANOUT, LEVEL_SLOTS, key_range
from ..protocol import CLIENT_SID_PREFIX, CRON_SID_PREFIX, request_of
from .inspection import _iso, _text, cron_view, state_variable  # the same forms as inspect shows, the same reader

KINDS = ("one-shot", "cron")
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
TOKEN_VERSION = 1
MAX_TOKEN_CHARS = 4096
ROUNDS = (16, 256, None)  # buckets read per round while a page is not full; None: all that remain
CHUNKS_PER_BUCKET = 4  # chunks looked at per bucket wanted when finding a round's buckets (shards, small chunks)


class BadPageToken(ValueError):
    """A continuation token that is not one of ours, or was made for other filters."""


@dataclass(frozen=True)
class ListFilters:
    due_after_ms: int | None = None  # due at or after
    due_before_ms: int | None = None  # due before
    destination: str | None = None
    id_prefix: str | None = None
    kind: str | None = None  # "one-shot" or "cron"

    def __post_init__(self):
        if self.kind is not None and self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r}: use one-shot or cron")

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class Cursor:
    """Where the next page starts: after (due_ms, delivery_id); read from ``batch``, for filters ``filters``."""

    due_ms: int
    delivery_id: str
    batch: int | None
    filters: str


def encode_token(cursor: Cursor) -> str:
    data = {"v": TOKEN_VERSION, "d": cursor.due_ms, "i": cursor.delivery_id, "b": cursor.batch, "f": cursor.filters}
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).rstrip(b"=").decode()


def decode_token(token: str, filters: ListFilters) -> Cursor:
    """The cursor of a token made for ``filters``; BadPageToken says what is wrong with it."""
    if not token or len(token) > MAX_TOKEN_CHARS:
        raise BadPageToken("not a page token of this listing (empty or too long)")
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode())
    except (ValueError, UnicodeDecodeError):
        raise BadPageToken("not a page token of this listing (pass it back as it was given)") from None
    if not isinstance(data, dict) or data.get("v") != TOKEN_VERSION:
        raise BadPageToken("not a page token of this listing (or one of another version)")
    due, delivery_id, batch, fingerprint = data.get("d"), data.get("i"), data.get("b"), data.get("f")
    if not (
        isinstance(due, int)
        and not isinstance(due, bool)
        and isinstance(delivery_id, str)
        and (batch is None or (isinstance(batch, int) and not isinstance(batch, bool)))
        and isinstance(fingerprint, str)
    ):
        raise BadPageToken("not a page token of this listing (damaged)")
    if fingerprint != filters.fingerprint():
        raise BadPageToken(
            "the page token was made for other filters: repeat the first page's filters, or start again without a token"
        )
    return Cursor(due, delivery_id, batch, fingerprint)


# ---------------------------------------------------------------- schedule ids


def sid_parts(sid) -> tuple[str, str | None, bytes | None]:
    """(kind, input topic, request id bytes) of a schedule id; (one-shot, topic or None, None) without a request id."""
    if sid is None or (isinstance(sid, float) and pd.isna(sid)):
        return "one-shot", None, None
    sid = bytes(sid)
    for prefix, kind in ((CLIENT_SID_PREFIX, "one-shot"), (CRON_SID_PREFIX, "cron")):
        if sid.startswith(prefix):
            topic, _, request_id = sid[len(prefix) :].partition(b"/")
            return kind, topic.decode("utf-8", "replace"), request_id
    rest = sid.split(b":", 1)[-1]
    return "one-shot", rest.split(b"/", 1)[0].decode("utf-8", "replace"), None


def _is_text(data: bytes | None) -> bool:
    try:
        return data is not None and bool(data) and data.decode("utf-8") is not None
    except UnicodeDecodeError:
        return False


def _kinds(frame: pd.DataFrame) -> pd.Series:
    return pd.Series(
        [
            "cron"
            if s is not None and not (isinstance(s, float)) and bytes(s).startswith(CRON_SID_PREFIX)
            else "one-shot"
            for s in frame["sid"]
        ],
        index=frame.index,
    )


def keep(frame: pd.DataFrame, filters: ListFilters, after: Cursor | None) -> pd.DataFrame:
    """The rows of a chunk frame (engine/processor/blobs.py CHUNK_SCHEMA) that match ``filters`` and come after
    ``after``."""
    mask = pd.Series(True, index=frame.index)
    due = frame["due_ms"].astype("int64")
    if filters.due_after_ms is not None:
        mask &= due >= filters.due_after_ms
    if filters.due_before_ms is not None:
        mask &= due < filters.due_before_ms
    if after is not None:
        mask &= (due > after.due_ms) | ((due == after.due_ms) & (frame["delivery_id"] > after.delivery_id))
    if filters.destination is not None:
        mask &= frame["topic"] == filters.destination
    frame = frame[mask]
    if len(frame) and filters.kind is not None:
        frame = frame[_kinds(frame) == filters.kind]
    if len(frame) and filters.id_prefix is not None:
        prefix = filters.id_prefix.encode()
        frame = frame[[sid_parts(s)[2] is not None and sid_parts(s)[2].startswith(prefix) for s in frame["sid"]]]
    return frame


class FirstRows:
    """The first ``n`` rows by (due time, delivery id) of frames added one at a time, in bounded memory."""

    def __init__(self, n: int):
        self.n = n
        self._frames: list[pd.DataFrame] = []
        self._rows = 0

    def add(self, frame: pd.DataFrame) -> None:
        if not len(frame):
            return
        self._frames.append(frame)
        self._rows += len(frame)
        if self._rows > 4 * self.n + 1024:
            self._frames = [self.frame()]
            self._rows = len(self._frames[0])

    def frame(self) -> pd.DataFrame:
        if not self._frames:
            return pd.DataFrame()
        return pd.concat(self._frames).sort_values(["due_ms", "delivery_id"], kind="stable").head(self.n)

    @property
    def full(self) -> bool:
        if self._rows < self.n:
            return False
        return len(self.frame()) >= self.n


# ---------------------------------------------------------------- the state, read by bucket range


def bucket_span_s(key: int) -> tuple[int, int]:
    """The first and the last second (both included) of the due times bucket ``key`` holds."""
    start_ms, end_ms = key_range(key)
    return start_ms // BUCKET_MS, end_ms // BUCKET_MS - 1


def _span_sql(column: str) -> tuple[str, str]:
    """``bucket_span_s`` of a bucket key column, as two Spark SQL expressions (first second, last second)."""
    offset = f"({column} - {COARSE_BASE})"
    width = f"CAST(pow({LEVEL_FANOUT}, pmod({offset}, {LEVEL_SLOTS})) AS BIGINT)"
    index = f"({offset} div {LEVEL_SLOTS})"
    return (
        f"CASE WHEN {column} < {COARSE_MIN} THEN {column} ELSE {index} * {width} END",
        f"CASE WHEN {column} < {COARSE_MIN} THEN {column} ELSE ({index} + 1) * {width} - 1 END",
    )


class BucketSource(Protocol):
    """The wheel's state of one committed batch, read by ranges of seconds (both ends included; None: open): the
    buckets whose span (``bucket_span_s``) meets the range."""

    def buckets(self, low: int, high: int | None, count: int) -> tuple[list[int], bool]:
        """The first distinct buckets holding chunks due in [low, high], as the last second of each, ascending: at
        most ``count``, found among the first ``count`` * CHUNKS_PER_BUCKET chunks (so perhaps fewer); and whether
        that is all the range holds."""

    def strikes(self, low: int, high: int | None) -> dict[tuple[int, int], set]:
        """(shard, bucket) -> delivery ids struck out of the bucket's chunks."""

    def paused(self) -> Iterator[pd.DataFrame]:
        """Frames of paused crons (the chunk columns; ``due_ms`` is where a replay would resume)."""

    def chunks(self, low: int, high: int | None) -> Iterator[tuple[int, int, pd.DataFrame]]:
        """(shard, bucket, frame of the chunk) for each chunk in the range, one at a time."""


def shard_of(spark, sid: bytes, shards: int) -> int:
    """The shard the job keeps ``sid`` in: engine/spark/query.shard_column, computed by Spark itself."""
    from pyspark.sql import functions as F

    return spark.range(1).select(F.pmod(F.xxhash64(F.lit(bytearray(sid))), F.lit(shards)).cast("int")).first()[0]


class StateSource:
    """BucketSource over Spark's state data source, pinned to ``batch`` (None: the newest committed batch); only
    ``shard``'s state if given."""

    def __init__(self, spark, checkpoint_dir: str, batch: int | None, shard: int | None = None):
        self.spark, self.checkpoint_dir, self.batch, self.shard = spark, checkpoint_dir, batch, shard

    def _state(self, name: str):
        from pyspark.sql import functions as F

        frame = state_variable(self.spark, self.checkpoint_dir, name, self.batch)
        return frame if self.shard is None else frame.where(F.col("key.shard") == self.shard)

    def _in_range(self, frame, low: int, high: int | None):
        from pyspark.sql import functions as F

        first, last = (F.expr(e) for e in _span_sql("user_map_key.bucket"))
        return frame.where(last >= low if high is None else (last >= low) & (first <= high))

    def buckets(self, low, high, count):
        from pyspark.sql import functions as F

        # The first chunks' buckets, one Spark job without a shuffle (a top-N per task), not a distinct and a sort.
        wanted = count * CHUNKS_PER_BUCKET
        rows = (
            self._in_range(self._state("chunks"), low, high)
            .select(F.expr(_span_sql("user_map_key.bucket")[1]).alias("last"))
            .orderBy("last")
            .limit(wanted)
        )
        rows = rows.collect()
        return sorted({row["last"] for row in rows})[:count], len(rows) < wanted

    def strikes(self, low, high):
        from pyspark.sql import functions as F

        struck: dict[tuple[int, int], set] = {}
        rows = self._in_range(self._state("strikes"), low, high).select(
            F.col("key.shard").alias("shard"),
            F.col("user_map_key.bucket").alias("bucket"),
            F.col("user_map_value.delivery_ids").alias("ids"),
        )
        for row in rows.toLocalIterator():
            struck.setdefault((row["shard"], row["bucket"]), set()).update(row["ids"] or ())
        return struck

    def paused(self):
        from pyspark.sql import functions as F
        from pyspark.sql.utils import AnalysisException

        from ..engine.processor.blobs import from_blob

        try:
            rows = self._state("paused").select(F.col("user_map_value.data").alias("data")).collect()
        except AnalysisException:  # a checkpoint written before paused crons existed
            return
        for row in rows:
            yield from_blob(row["data"])

    def chunks(self, low, high):
        from pyspark.sql import functions as F

        from ..engine.processor.blobs import from_blob

        rows = self._in_range(self._state("chunks"), low, high).select(
            F.col("key.shard").alias("shard"),
            F.col("user_map_key.bucket").alias("bucket"),
            F.col("user_map_value.data").alias("data"),
        )
        for row in rows.toLocalIterator():
            yield row["shard"], row["bucket"], from_blob(row["data"])


@dataclass
class Listing:
    as_of_ms: int
    batch: int | None
    filters: ListFilters
    limit: int
    schedules: list = field(default_factory=list)
    paused: list = field(default_factory=list)  # paused crons matching the filters (first page only)
    next_token: str | None = None
    continued_from_batch: int | None = None  # the batch of the page before (from the token)
    buckets_read: int = 0
    phases_s: dict = field(default_factory=dict)  # seconds spent finding buckets, reading strikes, reading chunks

    def to_json(self) -> dict:
        return {
            "as_of": _iso(self.as_of_ms),
            "batch": self.batch,
            "filters": self.filters.to_json(),
            "limit": self.limit,
            "schedules": self.schedules,
            "paused": self.paused,
            "next_page_token": self.next_token,
            "continued_from_batch": self.continued_from_batch,
            "state_moved_on": self.continued_from_batch is not None
            and self.batch is not None
            and self.batch != self.continued_from_batch,
        }


def list_schedules(
    source: BucketSource,
    filters: ListFilters,
    limit: int,
    cursor: Cursor | None,
    as_of_ms: int,
    batch: int | None,
    view: Callable | None = None,
    rounds: Iterable[int | None] = ROUNDS,
) -> Listing:
    """One page: the first ``limit`` schedules matching ``filters`` after ``cursor``, and the token of the next page
    if there is more."""
    view = view or (lambda row: schedule_view(row, as_of_ms))
    listing = Listing(as_of_ms, batch, filters, limit, continued_from_batch=cursor.batch if cursor else None)
    low_ms = max([m for m in (filters.due_after_ms, cursor.due_ms if cursor else None) if m is not None], default=None)
    low = low_ms // BUCKET_MS if low_ms is not None else -(2**62)
    high = (filters.due_before_ms - 1) // BUCKET_MS if filters.due_before_ms is not None else None
    first = FirstRows(limit + 1)  # one more than shown: is there a next page?
    for count in rounds:
        if high is not None and low > high:
            break
        started = time.monotonic()
        if count is None:
            upper, last_round = high, True
        else:
            found, exhausted = source.buckets(low, high, count)
            if not found:
                break
            upper, last_round = found[-1], exhausted and len(found) < count
            listing.buckets_read += len(found)
        found_s = time.monotonic()
        struck = source.strikes(low, upper)
        struck_s = time.monotonic()
        for shard, bucket, frame in source.chunks(low, upper):
            gone = struck.get((shard, bucket))
            if gone:
                frame = frame[~frame["delivery_id"].isin(gone)]
            first.add(keep(frame, filters, cursor))
        for phase, seconds in (
            ("buckets", found_s - started),
            ("strikes", struck_s - found_s),
            ("chunks", time.monotonic() - struck_s),
        ):
            listing.phases_s[phase] = listing.phases_s.get(phase, 0.0) + seconds
        # Every bucket after ``upper`` is due later than every row of the buckets read: a full page is final.
        if first.full or last_round or upper is None:
            break
        low = upper + 1
    if (
        cursor is None
        and filters.due_after_ms is None
        and filters.due_before_ms is None
        and filters.kind in (None, "cron")
    ):
        paused = FirstRows(MAX_LIMIT)
        for frame in source.paused():
            paused.add(keep(frame, filters, None))
        listing.paused = [view(as_paused(row)) for _, row in paused.frame().iterrows()]
    rows = first.frame()
    shown = rows.head(limit)
    listing.schedules = [view(row) for _, row in shown.iterrows()]
    if len(rows) > limit:
        last = shown.iloc[-1]
        listing.next_token = encode_token(
            Cursor(int(last["due_ms"]), str(last["delivery_id"]), batch, filters.fingerprint())
        )
    return listing


def schedule_view(row, as_of_ms: int, native_inputs: Iterable[str] = ()) -> dict:
    """One schedule as JSON-ready values: what ``inspect --id`` shows, its kind, ``cron`` (the cron_* columns) and
    the page's actions (native requests it can write for it: ``native_inputs`` are the job's native input topics)."""
    kind, topic, request_id = sid_parts(row.get("sid"))
    input_topic = topic or request_of(str(row["delivery_id"]))[0]
    headers = [
        {"key": h["key"], "value": _text(h["value"])} for h in (row["headers"] if row["headers"] is not None else [])
    ]
    view = {
        "kind": kind,
        "id": _text(request_id),
        "due": _iso(int(row["due_ms"])),
        "due_ms": int(row["due_ms"]),
        "due_already": int(row["due_ms"]) < as_of_ms,
        "destination": row["topic"],
        "input_topic": input_topic,
        "delivery_id": row["delivery_id"],
        "key": _text(row["key"]),
        "value": _text(row["value"]),
        "headers": headers,
    }
    partition = row.get("partition")
    if partition is not None and not pd.isna(partition):
        view["partition"] = int(partition)
    cron = cron_view(row).get("cron")
    if cron:
        view["cron"] = {name: _plain(value) for name, value in cron.items()}
    paused = bool(row.get("paused", False))
    if paused:
        view["paused"] = True  # ``due`` is where a replay would resume
    actions: list[str] = []
    if _is_text(request_id) and input_topic in set(native_inputs):
        actions = ["CANCEL"] if kind == "one-shot" else ["CRON_RESUME" if paused else "CRON_PAUSE", "CRON_CANCEL"]
    view["actions"] = actions
    return view


def _plain(value):
    """A cell as JSON: bytes as text, NaN as null, numpy numbers as Python's."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _text(value)
    if hasattr(value, "item") and not isinstance(value, (list, dict)):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, float) and pd.isna(value):
        return None
    if isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return [_plain(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
    return str(value)


def render_table(listing: Listing) -> str:
    """The page as text: one line per schedule, then how to get the next page."""
    lines = [
        f"pending schedules as of batch {listing.batch} (read {_iso(listing.as_of_ms)}), by due time: "
        f"{len(listing.schedules)} shown"
        + (
            f"; the state moved on since batch {listing.continued_from_batch}"
            if listing.to_json()["state_moved_on"]
            else ""
        )
    ]
    if listing.schedules:
        lines.append(f"  {'due (UTC)':<24}  {'kind':<8}  {'id':<24}  {'destination':<20}  value")
    for s in listing.schedules:
        value = s["value"] if s["value"] is None or len(s["value"]) <= 40 else s["value"][:37] + "..."
        ident = s["id"] if s["id"] is not None else "(none)"
        lines.append(
            f"  {s['due']:<24}  {s['kind']:<8}  {ident:<24}  {s['destination']:<20}  {value!r}"
            + ("  (due already)" if s["due_already"] else "")
        )
        if "cron" in s:
            lines.append("      cron " + ", ".join(f"{k}={v}" for k, v in s["cron"].items() if v is not None))
    if listing.paused:
        lines.append(f"paused crons: {len(listing.paused)}")
    for s in listing.paused:
        ident = s["id"] if s["id"] is not None else "(none)"
        lines.append(
            f"  {'paused (from ' + s['due'] + ')':<24}  {s['kind']:<8}  {ident:<24}  {s['destination']:<20}  "
            f"{s['value']!r}"
        )
        if "cron" in s:
            lines.append("      cron " + ", ".join(f"{k}={v}" for k, v in s["cron"].items() if v is not None))
    lines.append(f"next page: --page-token {listing.next_token}" if listing.next_token else "no more schedules")
    return "\n".join(lines)


# ---------------------------------------------------------------- the query of a page, from the CLI or the route

LIST_PARAMETERS = ("due_after", "due_before", "destination", "id_prefix", "kind", "limit", "page_token")


def parse_instant(text: str, name: str) -> int:
    """An ISO-8601 instant with a zone, in Unix milliseconds; ValueError naming ``name`` otherwise."""
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{name} {text!r}: expected an ISO-8601 instant, e.g. 2026-12-24T18:00:00Z") from None
    if moment.tzinfo is None:
        raise ValueError(f"{name} {text!r}: give a time zone (Z or +01:00)")
    return int(moment.astimezone(UTC).timestamp() * 1000)


def parse_limit(text: str, name: str = "limit") -> int:
    try:
        limit = int(text)
    except (TypeError, ValueError):
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"{name} {text!r}: a number from 1 to {MAX_LIMIT}")
    return limit


def list_query(values: dict) -> tuple[ListFilters, int, Cursor | None]:
    """Filters, limit and cursor from ``values`` (LIST_PARAMETERS -> text or None); ValueError (BadPageToken for
    the token) says what is wrong, naming the parameter as the route does (the CLI's flags are these with dashes)."""
    unknown = sorted({k for k, v in values.items() if v is not None} - set(LIST_PARAMETERS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}: use {', '.join(LIST_PARAMETERS)} (or id for a look-up)")
    kind = values.get("kind")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind {kind!r}: use one-shot or cron")
    filters = ListFilters(
        due_after_ms=parse_instant(values["due_after"], "due_after") if values.get("due_after") else None,
        due_before_ms=parse_instant(values["due_before"], "due_before") if values.get("due_before") else None,
        destination=values.get("destination") or None,
        id_prefix=values.get("id_prefix") or None,
        kind=kind or None,
    )
    limit = parse_limit(values["limit"]) if values.get("limit") not in (None, "") else DEFAULT_LIMIT
    token = values.get("page_token")
    cursor = decode_token(token, filters) if token else None
    return filters, limit, cursor


def as_paused(row: pd.Series) -> pd.Series:
    """A row of the ``paused`` state as ``schedule_view`` shows a paused cron (Resume instead of Pause)."""
    return pd.concat([row, pd.Series({"paused": True})])


def find_paused(source: BucketSource, sid: bytes) -> pd.DataFrame:
    """The paused cron ``sid`` (one row, or none)."""
    found = FirstRows(1_000)
    for frame in source.paused():
        found.add(frame[[s is not None and not isinstance(s, float) and bytes(s) == sid for s in frame["sid"]]])
    return found.frame()


def find_sid(source: BucketSource, sid: bytes) -> pd.DataFrame:
    """The pending rows of one schedule id (a source narrowed to its shard reads a fraction of the state)."""
    found = FirstRows(1_000)
    struck = source.strikes(-(2**62), None)
    for shard, bucket, frame in source.chunks(-(2**62), None):
        gone = struck.get((shard, bucket))
        if gone:
            frame = frame[~frame["delivery_id"].isin(gone)]
        found.add(frame[[s is not None and not isinstance(s, float) and bytes(s) == sid for s in frame["sid"]]])
    return found.frame()
