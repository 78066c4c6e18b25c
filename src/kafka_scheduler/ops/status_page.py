"""What the status page shows (the routes that serve it are in http_server.py): health, the counts of the metrics'
registry, lateness over the last hour, recent rejections, and pending schedules read from the state store.

Everything /api/status shows comes from the same registry a scrape reads (and the in-memory rings fed by the same
calls, recent.py), so the page and /metrics agree. Reading the state store costs a Spark job: it is done only when
someone asks, never on the batch path (upcoming.py: the counts of /api/upcoming and of the counted gauges, and the
reads on request).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources

from ..engine.rules.rejection_classes import ABOUT, OTHER
from .upcoming import StateReader, UpcomingCache

log = logging.getLogger(__name__)

SCHEDULES_LIMIT = 20

# Health. An idle job runs no batch at all, so a quiet job is stalled only when there is work it does not do.
STALL_AFTER_S = 120.0  # records waiting (input lag), or a wake-up overdue, with no batch for this long
LATE_P99_S = 5.0  # the p99 lateness of the last RECENT_S above this: late
LATE_LAG_RECORDS = 10_000  # this many requests not read yet: late
RECENT_S = 300.0


@lru_cache(maxsize=1)
def page_html() -> bytes:
    """The page, read through the package (also from a zip on --py-files, under spark-submit)."""
    return resources.files(__package__).joinpath("status_page.html").read_bytes()


def iso(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ---------------------------------------------------------------- /api/status (pure)

Samples = dict  # (sample name, ((label, value), ...) sorted) -> value


def snapshot(registry) -> Samples:
    """Every sample of the registry at once, as a scrape sees them."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples}


def total(samples: Samples, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, pairs), v in samples.items() if n == name and wanted <= set(pairs))


def by_label(samples: Samples, name: str, label: str) -> dict:
    found: Counter = Counter()
    for (n, pairs), v in samples.items():
        if n == name:
            found[dict(pairs).get(label, "")] += v
    return {k: v for k, v in sorted(found.items()) if v}


def health(
    now_s: float,
    started_s: float,
    last_batch_s: float | None,
    batches: float,
    next_wakeup_s: float | None,
    lag_total: float,
    recent_p99_s: float | None,
) -> dict:
    """ok, late, stalled or starting, and why (one sentence)."""
    quiet_s = now_s - (last_batch_s or started_s)
    wake_overdue_s = now_s - next_wakeup_s if next_wakeup_s and (last_batch_s or 0) < next_wakeup_s else 0
    if lag_total > 0 and quiet_s > STALL_AFTER_S:
        return {
            "verdict": "stalled",
            "reason": f"{lag_total:,.0f} input records waiting and no batch for {quiet_s:,.0f} s",
        }
    if wake_overdue_s > STALL_AFTER_S:
        return {"verdict": "stalled", "reason": f"a wake-up was due {wake_overdue_s:,.0f} s ago and no batch ran since"}
    if not batches:
        return {"verdict": "starting", "reason": "no batch completed yet"}
    if recent_p99_s is not None and recent_p99_s > LATE_P99_S:
        return {
            "verdict": "late",
            "reason": f"deliveries of the last {RECENT_S / 60:.0f} minutes: p99 {recent_p99_s:.1f} s late",
        }
    if lag_total > LATE_LAG_RECORDS:
        return {"verdict": "late", "reason": f"{lag_total:,.0f} input records not read yet"}
    return {"verdict": "ok", "reason": "deliveries on time, input read"}


def status_json(
    samples: Samples,
    now_s: float,
    started_s: float,
    app_id: str,
    lateness_hour: dict,
    lateness_recent: dict,
    lateness_minutes: list[dict],
    rejections: list[dict],
) -> dict:
    """What /api/status answers, from one snapshot of the registry and the rings (recent.py)."""
    m = "kafka_scheduler_"
    last_batch = total(samples, m + "last_batch_timestamp_seconds") or None
    next_wakeup = total(samples, m + "next_wakeup_timestamp_seconds") or None
    batches = total(samples, m + "batches_total")
    lag = sorted(
        (
            {"topic": dict(pairs)["topic"], "partition": int(dict(pairs)["partition"]), "records": int(v)}
            for (n, pairs), v in samples.items()
            if n == m + "input_lag_records"
        ),
        key=lambda e: (e["topic"], e["partition"]),
    )
    lag_total = sum(e["records"] for e in lag)
    # Counted from the checkpoint (NaN before the first count; an earliest due of 0: none pending).
    counted_at = total(samples, m + "counted_timestamp_seconds")
    counted_at = None if math.isnan(counted_at) or not counted_at else counted_at
    next_due = total(samples, m + "earliest_pending_due_timestamp_seconds") if counted_at else None
    next_due = next_due or None
    return {
        "app_id": app_id,
        "as_of": iso(now_s),
        "uptime_s": round(now_s - started_s, 1),
        "pending": int(total(samples, m + "pending_schedules")),
        # The next timer fires up to --lookahead plus a preparation lead before the earliest due time: not a due time.
        "next_wakeup": {"at": iso(next_wakeup), "in_s": round(next_wakeup - now_s, 3) if next_wakeup else None},
        "next_due": {
            "at": iso(next_due),
            "in_s": round(next_due - now_s, 3) if next_due else None,
            "counted_at": iso(counted_at),
        },
        "delivered": {
            "total": int(total(samples, m + "delivered_total")),
            "at_once": int(total(samples, m + "delivered_at_once_total")),
            "written_back": int(total(samples, m + "written_back_total")),
            "dead_lettered": int(total(samples, m + "dead_lettered_total")),
        },
        "requests": {k: int(v) for k, v in by_label(samples, m + "requests_total", "outcome").items()},
        "rejected": {
            "total": int(total(samples, m + "rejected_total")),
            "by_class": {k: int(v) for k, v in by_label(samples, m + "rejected_total", "reason_class").items()},
        },
        "lateness": {
            "window_s": 3600,
            **_rounded(lateness_hour),
            "last_5_min": _rounded(lateness_recent),
            "per_minute": [{"start": iso(e["start"]), **_rounded(e)} for e in lateness_minutes],
            "since_start_count": int(total(samples, m + "delivery_lateness_seconds_count")),
        },
        "rejections": [
            {
                "at": iso(e["at"]),
                "input_topic": e["input_topic"],
                "dialect": e["dialect"],
                "reason_class": e["reason_class"],
                "count": e["count"],
                "about": ABOUT.get(e["reason_class"], ABOUT[OTHER]),
            }
            for e in rejections
        ],
        "health": {
            **health(now_s, started_s, last_batch, batches, next_wakeup, lag_total, lateness_recent["p99_s"]),
            "last_batch": iso(last_batch),
            "last_batch_age_s": round(now_s - last_batch, 1) if last_batch else None,
            "batches": int(batches),
            "input_lag": lag,
            "input_lag_total": lag_total,
        },
    }


def _rounded(stats: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items() if k != "start"}


# ---------------------------------------------------------------- the page and its routes


class StatusPage:
    """The routes; ``attach_state`` once the job's Spark session is up (before that, the state routes say so)."""

    def __init__(
        self, metrics, app_id: str = "", started_s: float | None = None, clock: Callable[[], float] = time.time
    ):
        self.metrics, self.app_id, self.clock = metrics, app_id, clock
        self.started_s = started_s if started_s is not None else clock()
        self.state = StateReader()
        self.upcoming = UpcomingCache(self.state, clock=clock)
        self.actions = None  # actions.RequestWriter, once the broker answers (attach_actions)
        self.shards: int | None = None
        metrics.follow_state_counts(self.upcoming.counted)

    def attach_state(self, spark, checkpoint_dir: str, shards: int | None = None) -> None:
        self.shards = shards
        self.state.attach(spark, checkpoint_dir)

    def attach_actions(self, writer) -> None:
        self.actions = writer

    def detach_state(self) -> None:
        self.state.detach()

    def status(self) -> dict:
        now = self.clock()
        rings = self.metrics.recent_lateness
        return status_json(
            snapshot(self.metrics.registry),
            now,
            self.started_s,
            self.app_id,
            rings.stats(now),
            rings.stats(now, RECENT_S),
            rings.per_slot(now),
            self.metrics.recent_rejections.entries(),
        )

    def scraped(self) -> None:
        """A scrape keeps the counted gauges current: a recount starts when the last count is stale."""
        self.upcoming.get()

    def schedules(self, ids: list[str]) -> tuple[int, dict]:
        from .inspection import Filters, Inspection, inspect_checkpoint

        ids = [i for i in ids if i.strip()]
        if not ids:
            return 400, {"error": "missing id: ask /api/schedules?id=<request id> (repeat id for several)"}
        as_of_ms = int(self.clock() * 1000)
        try:
            found = self.state.run(
                lambda spark, checkpoint_dir, batch: inspect_checkpoint(
                    spark, checkpoint_dir, Filters(ids=tuple(ids)), as_of_ms, batch, SCHEDULES_LIMIT
                ),
                empty=lambda: Inspection(as_of_ms, None),
            )
        except TimeoutError as exc:
            return 503, {"error": f"{exc}; try again"}
        if found is None:
            return 503, {"error": "the job's Spark session is not up (starting or stopping); try again"}
        return 200, {"ids": ids, **found.to_json()}

    # ------------------------------------------------------------ the listing and the buttons (protected routes)

    def _native_inputs(self) -> list[str]:
        return self.actions.native_inputs if self.actions is not None else []

    def listing(self, query: dict) -> tuple[int, dict]:
        """``GET /api/schedules`` without id: a page of the listing (listing.py); 400 on a bad parameter or token."""
        from ..engine.spark.state_reader import CheckpointState
        from .listing import BadPageToken, Listing, list_query, list_schedules, schedule_view

        values = {}
        for name, given in query.items():
            if len(given) > 1:
                return 400, {"error": f"{name} is given {len(given)} times: give it once"}
            values[name] = given[0]
        try:
            filters, limit, cursor = list_query(values)
        except BadPageToken as exc:
            return 400, {"error": f"page_token: {exc}"}
        except ValueError as exc:
            return 400, {"error": str(exc)}
        as_of_ms = int(self.clock() * 1000)
        native = self._native_inputs()
        try:
            found = self.state.run(
                lambda spark, checkpoint_dir, batch: list_schedules(
                    CheckpointState(spark, checkpoint_dir, batch),
                    filters,
                    limit,
                    cursor,
                    as_of_ms,
                    batch,
                    view=lambda row: schedule_view(row, as_of_ms, native),
                ),
                empty=lambda: Listing(
                    as_of_ms, None, filters, limit, continued_from_batch=cursor.batch if cursor else None
                ),
            )
        except TimeoutError as exc:
            return 503, {"error": f"{exc}; try again"}
        if found is None:
            return 503, {"error": "the job's Spark session is not up (starting or stopping); try again"}
        return 200, found.to_json()

    def act(self, body: dict, client: str) -> tuple[int, dict]:
        """``POST /api/actions``: write the native request, wait for the batch that reads it, read the schedule again
        and say what became of it."""
        from .actions import ACTION_KIND, WAIT_S, ActionError

        if self.actions is None:
            return 503, {"error": "the job is not connected to Kafka yet; try again"}
        try:
            action, request_id, topic = self.actions.check(body.get("action"), body.get("id"), body.get("input_topic"))
        except ActionError as exc:
            return 400, {"error": str(exc)}
        try:
            written = self.actions.write(action, request_id, topic)
        except Exception as exc:  # the broker away, the topic gone: nothing was written
            return 503, {"error": f"{action} not written: {exc}"}
        log.info(
            "status page: %s id=%s written to %s partition %d offset %d, for %s",
            action,
            request_id,
            topic,
            written.partition,
            written.offset,
            client,
        )
        answer = {"request": written.to_json()}
        if not self.actions.wait_ruled(written, WAIT_S):
            return 202, {
                **answer,
                "outcome": "written",
                "message": (
                    f"{action} written ({topic} partition {written.partition}, offset {written.offset}); "
                    f"the job has not committed a batch past it within {WAIT_S:.0f} s: it acts when the job reads it "
                    "(list again later)"
                ),
            }
        try:
            batch, rows, paused = self._versions(ACTION_KIND[action], topic, request_id)
        except TimeoutError as exc:
            return 202, {
                **answer,
                "outcome": "ruled",
                "message": f"{action} ruled on; reading the state again failed: {exc}",
            }
        shown = body.get("delivery_id")
        if action == "CRON_PAUSE" and paused:
            outcome, message = "paused", f"cron {request_id} paused as of batch {batch}"
        elif action == "CRON_RESUME" and rows:
            outcome, message = "resumed", f"cron {request_id} resumed as of batch {batch}: next firing {rows[0]['due']}"
        elif action == "CRON_RESUME" and paused:
            outcome, message = "still_paused", f"cron {request_id} is still paused as of batch {batch}"
        elif not rows and not paused:
            outcome, message = (
                "not_pending",
                f"id {request_id} has no pending {ACTION_KIND[action]} any more (as of batch {batch})",
            )
        elif action in ("CANCEL", "CRON_CANCEL"):
            newer = shown is not None and all(r["delivery_id"] != shown for r in rows)
            outcome, message = (
                ("replaced", f"id {request_id}: a newer version is pending (a later request replaced the one shown)")
                if newer
                else (
                    "still_pending",
                    f"id {request_id} is still pending as of batch {batch}: the request did not take "
                    f"it back (delivered first, or replaced since)",
                )
            )
        else:
            outcome, message = "ruled", f"{action} ruled on as of batch {batch}"
        return 200, {
            **answer,
            "outcome": outcome,
            "message": message,
            "batch": batch,
            "schedules": rows,
            "paused": paused,
        }

    def _versions(self, kind: str, topic: str, request_id: str) -> tuple[int | None, list, list]:
        """The pending rows of the schedule (one-shot or cron) ``request_id`` of ``topic``, read from its shard, and
        the cron's row if it is paused."""
        from ..engine.spark.state_reader import CheckpointState, shard_of
        from ..protocol import CLIENT_SID_PREFIX, CRON_SID_PREFIX, schedule_sid
        from .listing import as_paused, find_schedule, schedule_view

        sid = schedule_sid(topic, request_id.encode(), CRON_SID_PREFIX if kind == "cron" else CLIENT_SID_PREFIX)
        as_of_ms = int(self.clock() * 1000)
        native = self._native_inputs()

        def read(spark, checkpoint_dir, batch):
            shard = shard_of(sid, self.shards) if self.shards else None
            frame, paused = find_schedule(CheckpointState(spark, checkpoint_dir, batch, shard), sid, kind == "cron")
            return (
                batch,
                [schedule_view(row, as_of_ms, native) for _, row in frame.iterrows()],
                [schedule_view(as_paused(row), as_of_ms, native) for _, row in paused.iterrows()],
            )

        found = self.state.run(read, empty=lambda: (None, [], []))
        if found is None:
            raise TimeoutError("the job's Spark session is not up")
        return found
