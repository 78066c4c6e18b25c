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

**Cost.** The state is read through the engine's reader (engine/spark/state_reader.py), pinned to the page's batch:
first the buckets that may hold schedules due in the range wanted, in time order (one Spark job: keys and sizes, no
data; with the paused crons on a first page), then their chunks less their strikes, in that order, a Spark job per
group of chunks of a few MiB, and only as far as the page needs: once ``limit`` + 1 matching schedules are due before
the start of the next bucket not read, no later bucket can hold one due earlier, and the reading stops. Only the
``limit`` + 1 first schedules are kept. Filters on the due time narrow the buckets read; the others (destination, id
prefix, kind) are applied to each chunk, so a filter that matches few schedules reads more.

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

from ..delivery_ids import request_of
from ..engine.spark.state_reader import Bucket
from ..protocol import CLIENT_SID_PREFIX, CRON_SID_PREFIX
from .inspection import cron_view, header_views, iso_ms, shown_text  # the same forms as inspect shows

KINDS = ("one-shot", "cron")
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
TOKEN_VERSION = 1
MAX_TOKEN_CHARS = 4096


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

    def final_before(self, bound_ms: int) -> bool:
        """Whether the first ``n`` rows are all due before ``bound_ms``: with nothing unread due before it, they are
        the first ``n`` of everything."""
        if self._rows < self.n:
            return False
        kept = self.frame()
        self._frames, self._rows = [kept], len(kept)  # asked at every bucket read: sorted once, kept sorted
        return len(kept) >= self.n and int(kept["due_ms"].iloc[self.n - 1]) < bound_ms


# ---------------------------------------------------------------- the state, read in time order


class PendingSource(Protocol):
    """The wheel's state of one committed batch (engine/spark/state_reader.CheckpointState)."""

    def buckets(
        self, from_ms: int | None, before_ms: int | None, with_paused: bool = False
    ) -> tuple[list[Bucket], list[pd.DataFrame]]:
        """The buckets that may hold schedules due in [from_ms, before_ms) in time order (by the first due time each
        may hold), and the paused crons' frames when asked."""

    def pending(self, buckets: Iterable[Bucket]) -> Iterator[tuple[Bucket, pd.DataFrame]]:
        """The pending rows of ``buckets`` (less their strikes), a chunk at a time, in the order given; read as the
        caller goes on."""


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
    phases_s: dict = field(default_factory=dict)  # seconds spent finding the buckets, reading their chunks

    def to_json(self) -> dict:
        return {
            "as_of": iso_ms(self.as_of_ms),
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
    source: PendingSource,
    filters: ListFilters,
    limit: int,
    cursor: Cursor | None,
    as_of_ms: int,
    batch: int | None,
    view: Callable | None = None,
) -> Listing:
    """One page: the first ``limit`` schedules matching ``filters`` after ``cursor``, and the token of the next page
    if there is more."""
    view = view or (lambda row: schedule_view(row, as_of_ms))
    listing = Listing(as_of_ms, batch, filters, limit, continued_from_batch=cursor.batch if cursor else None)
    from_ms = max([m for m in (filters.due_after_ms, cursor.due_ms if cursor else None) if m is not None], default=None)
    before_ms = filters.due_before_ms
    with_paused = (
        cursor is None
        and filters.due_after_ms is None
        and filters.due_before_ms is None
        and filters.kind in (None, "cron")
    )
    started = time.monotonic()
    empty = from_ms is not None and before_ms is not None and from_ms >= before_ms
    buckets, paused_frames = ([], []) if empty else source.buckets(from_ms, before_ms, with_paused)
    found_s = time.monotonic()
    first = FirstRows(limit + 1)  # one more than shown: is there a next page?
    current = None
    for bucket, frame in source.pending(buckets):
        if bucket is not current:
            # Every bucket before this one in time order is read: what is due before its start is all seen.
            if current is not None and first.final_before(bucket.start_ms):
                break
            current = bucket
            listing.buckets_read += 1
        first.add(keep(frame, filters, cursor))
    listing.phases_s = {"buckets": found_s - started, "chunks": time.monotonic() - found_s}
    if with_paused:
        paused = FirstRows(MAX_LIMIT)
        for frame in paused_frames:
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
    headers = header_views(row["headers"])
    view = {
        "kind": kind,
        "id": shown_text(request_id),
        "due": iso_ms(int(row["due_ms"])),
        "due_ms": int(row["due_ms"]),
        "due_already": int(row["due_ms"]) < as_of_ms,
        "destination": row["topic"],
        "input_topic": input_topic,
        "delivery_id": row["delivery_id"],
        "key": shown_text(row["key"]),
        "value": shown_text(row["value"]),
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
        return shown_text(value)
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
        f"pending schedules as of batch {listing.batch} (read {iso_ms(listing.as_of_ms)}), by due time: "
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


def find_schedule(source: PendingSource, sid: bytes, with_paused: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The pending rows of one schedule id, and (``with_paused``) its paused cron's row: a source narrowed to the
    id's shard reads a fraction of the state."""

    def of_sid(frame: pd.DataFrame) -> pd.DataFrame:
        return frame[[s is not None and not isinstance(s, float) and bytes(s) == sid for s in frame["sid"]]]

    buckets, paused_frames = source.buckets(None, None, with_paused)
    found, paused = FirstRows(1_000), FirstRows(1_000)
    for _, frame in source.pending(buckets):
        found.add(of_sid(frame))
    for frame in paused_frames:
        paused.add(of_sid(frame))
    return found.frame(), paused.frame()
