"""The rules of recurring schedules (CRON_ADD, CRON_PAUSE, CRON_RESUME, CRON_CANCEL; see protocols.md, "Recurring
schedules"): per cron id in log order, and fresh registrations in bulk. A cron's state is its one pending firing in
a bucket (the id index names it) or, paused, its definition in the ``paused`` map; the next firings of a cron whose
firing left state are filed by ``ShardTransaction.advance_crons``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ...delivery_ids import activation_of, firing_id
from . import cron as crons
from .batch_result import BatchResult
from .buckets import FAR_FUTURE_MS
from .cells import missing, optional_int
from .digests import cron_digest, cron_digest_of_entry
from .entries import entries_frame, named_rows, schedule_of_entry, with_entry_dtypes
from .fields import ENTRY_COLUMNS
from .index_cache import PAUSED_MS, IndexEntry
from .schedule import Action, Cron, Outcome, Schedule, input_topic_of
from .shard import ShardTransaction

DEFAULT_CRON_MIN_INTERVAL_MS = 5000


def apply_cron_requests(
    shard: ShardTransaction, by_sid: dict, result: BatchResult, to_file: tuple[list, list], min_interval_ms: int
) -> None:
    """The requests of crons, per id in log order (see protocols.md, "Recurring schedules"). A cron's state is its one
    pending firing in the wheel (the index names it), or, paused, its definition in the ``paused`` map (the index
    entry's due time is PAUSED_MS). A version's firing that the timed writer may hold is withdrawn and struck out of
    its bucket when the cron is paused, replaced or cancelled; a firing already written stays written."""
    index, store, now = shard.index(), shard.store, shard.now_ms
    outcomes, by_topic = result.outcomes, result.by_topic
    # A pause of an active cron needs its definition: the row of its pending firing, read from its bucket (grouped).
    wanted: dict = {}
    for sid, requests in by_sid.items():
        entry = index.get(sid)
        if entry is not None and entry.due_ms != PAUSED_MS and any(r.action is Action.CRON_PAUSE for r in requests):
            wanted.setdefault(shard.locate(entry.due_ms), set()).add(entry.delivery_id)
    rows = shard.rows_by_delivery_id(wanted) if wanted else {}

    for sid, requests in by_sid.items():
        topic = input_topic_of(sid)
        initial = index.get(sid)
        kind = "none" if initial is None else "paused" if initial.due_ms == PAUSED_MS else "active"
        written = kind == "active" and shard.written(initial)
        version: Schedule | None = None  # the cron as this batch left it (active: due_ms its first firing;
        version_digest = None if initial is None else initial.digest  # paused: due_ms where a replay resumes)
        changed = False
        replayed_id = None  # a replay due at once: its first firing's id (replayed_firing_id)

        for request in requests:
            action = request.action
            if action is Action.CRON_ADD:
                schedule = request.schedule
                definition = schedule.cron
                reason = crons.problem(definition.expr, definition.tz, min_interval_ms)
                if reason is not None:
                    result.reject(
                        topic,
                        [
                            (
                                schedule.key,
                                schedule.value,
                                request.raw_headers,
                                request.activation or schedule.delivery_id,
                                reason,
                            )
                        ],
                    )
                    continue
                new_digest = cron_digest(schedule)
                if kind == "active" and new_digest == version_digest:
                    outcome = Outcome.CRON_REPLACE_NOOP
                else:
                    outcome = Outcome.CRON_ADDED if kind == "none" else Outcome.CRON_REPLACED
                    first = crons.first_firing(
                        definition.expr, definition.tz, now, definition.start_ms, definition.end_ms
                    )
                    activation = request.activation or schedule.delivery_id
                    changed, version_digest, replayed_id = True, new_digest, None
                    if first is None:  # nothing left to fire (past its end): registered and gone
                        kind, version = "none", None
                    else:
                        kind, written = "active", False
                        version = dataclasses.replace(schedule, due_ms=first, delivery_id=firing_id(activation, first))
            elif action is Action.CRON_PAUSE:
                if kind != "active":
                    outcome = Outcome.CRON_PAUSE_NOOP
                else:
                    outcome = Outcome.CRON_PAUSED
                    # the definition as it stands, its due time the pending firing
                    base = version if changed else rows[initial.delivery_id]
                    cursor = base.due_ms
                    if written:  # its pending firing is written: the next one is where a replay would resume
                        following = crons.spec(base.cron.expr, base.cron.tz).next_after(cursor)
                        cursor = FAR_FUTURE_MS if following is None else following
                    kind, changed, replayed_id = "paused", True, None
                    version = dataclasses.replace(base, due_ms=cursor, delivery_id=activation_of(base.delivery_id))
            elif action is Action.CRON_RESUME:
                if kind != "paused":
                    outcome = Outcome.CRON_RESUME_NOOP
                else:
                    outcome = Outcome.CRON_RESUMED
                    # the definition as it stands, its due time the cursor where a replay resumes
                    base = version if changed else schedule_of_entry(next(named_rows(store.paused_get(sid))))
                    first = resumed_at(base.cron, base.due_ms, now)
                    changed = True
                    if first is None:
                        kind, version = "none", None
                    else:
                        kind, written = "active", False
                        version = dataclasses.replace(
                            base, due_ms=first, delivery_id=firing_id(request.activation, first)
                        )
                        replayed_id = replayed_firing_id(base.delivery_id, first)
            elif action is Action.CRON_CANCEL:
                if kind == "none":
                    outcome = Outcome.CRON_CANCEL_NOOP
                else:
                    outcome = Outcome.CRON_CANCELLED
                    kind, version, changed = "none", None, True
            else:
                raise ValueError(f"not a cron action: {action}")
            outcomes[outcome] += 1
            by_topic[(outcome, topic)] += 1

        if not changed:
            continue
        if initial is not None:
            if initial.due_ms == PAUSED_MS:
                if kind != "paused":
                    store.paused_remove(sid)
            else:
                withdraw_firing(shard, initial, written, result)
        if kind == "none":
            if initial is not None:
                index.remove(sid)
        elif kind == "paused":
            store.paused_put(sid, entries_frame([version], [(sid, version_digest)]))
            index.put(sid, IndexEntry(PAUSED_MS, version.delivery_id, version_digest))
        elif version.due_ms <= now:  # a replay: due at once, and those after it in turn (advance_crons)
            frame = entries_frame([version], [(sid, version_digest)])
            result.emitted.append(frame.assign(delivery_id=[replayed_id or version.delivery_id]))
            shard.cron_gone.append(frame.assign(_after=frame["due_ms"].to_numpy(dtype=np.int64)))
            if initial is not None:
                index.remove(sid)
        else:
            schedules, ids = to_file
            schedules.append(version)
            ids.append((sid, version_digest))
            index.put(sid, IndexEntry(version.due_ms, version.delivery_id, version_digest))


def replayed_firing_id(paused_activation: str, first_ms: int) -> str | None:
    """The id of the first firing a replay delivers at once when a cron resumes: the one the pause withdrew, so the
    id it had in the activation the cron was paused in. A withdrawal reaches the timed writer only at the end of the
    pausing batch; if that batch was still running at the firing's instant, the writer had written it, and the
    replay is then a duplicate with the same id (at-least-once), not a second firing with another id. The firings
    after it carry the resume's activation."""
    return firing_id(paused_activation, first_ms)


def resumed_at(definition: Cron, cursor: int, now_ms: int) -> int | None:
    """The first firing of a resumed cron: with ``replay``, the first one the pause withdrew (``cursor``; those due
    are delivered at once, in order), with ``skip`` the first after now. None: none left (past its end)."""
    if definition.policy == "skip":
        return crons.first_firing(
            definition.expr, definition.tz, max(now_ms, cursor - 1), definition.start_ms, definition.end_ms
        )
    end = FAR_FUTURE_MS if definition.end_ms is None else definition.end_ms
    return cursor if cursor <= end else None


def withdraw_firing(shard: ShardTransaction, entry: IndexEntry, written: bool, result: BatchResult) -> None:
    """A cron paused, replaced or cancelled: its pending firing is struck out of its bucket (even when written:
    retiring it would otherwise file the next firing of that version), and withdrawn from the timed writer if it
    may hold it."""
    shard.strike(entry)
    if not written and shard.may_be_held(entry):
        result.withdrawn.append(entry.delivery_id)


def register_fresh_crons(
    shard: ShardTransaction, adds: pd.DataFrame, result: BatchResult, min_interval_ms: int
) -> pd.DataFrame | None:
    """CRON_ADDs of ids without a cron that no other request of the batch names (the usual registration), in bulk:
    one validation and one first-firing computation per distinct definition, not per row. Returns the entries to
    file (due_ms the first firing)."""
    now = shard.now_ms
    topics = (
        adds["src_topic"].to_numpy()
        if "src_topic" in adds
        else np.array([input_topic_of(s) for s in adds["sid"]], dtype=object)
    )
    exprs, zones = adds["cron_expr"].to_numpy(), adds["cron_tz"].to_numpy()
    reasons = np.array(
        _per_distinct(lambda e, z: crons.problem(e, None if missing(z) else z, min_interval_ms), exprs, zones),
        dtype=object,
    )
    bad = pd.notna(reasons)
    if bad.any():
        for topic in pd.unique(topics[bad]):
            of_topic = bad & (topics == topic)
            result.reject(
                str(topic),
                list(
                    zip(
                        adds["key"][of_topic],
                        adds["value"][of_topic],
                        adds["raw_headers"][of_topic],
                        adds["delivery_id"][of_topic],
                        reasons[of_topic],
                    )
                ),
            )
    good = adds[~bad].reset_index(drop=True)
    if not len(good):
        return None
    for topic, n in pd.Series(topics[~bad]).value_counts().items():
        result.by_topic[(Outcome.CRON_ADDED, topic)] += int(n)
    result.outcomes[Outcome.CRON_ADDED] += len(good)
    keys = list(zip(good["cron_expr"], good["cron_tz"], good["cron_start_ms"], good["cron_end_ms"]))
    firsts: dict = {}
    for key in set(map(_hashable, keys)):
        expr, tz, start, end = key
        first = crons.first_firing(expr, tz, now, start, end)
        firsts[key] = -1 if first is None else first
    due = np.array([firsts[_hashable(k)] for k in keys], dtype=np.int64)
    filed = good[due >= 0].assign(due_ms=due[due >= 0]).reset_index(drop=True)
    if not len(filed):
        return None
    filed["delivery_id"] = [firing_id(d, t) for d, t in zip(filed["delivery_id"], filed["due_ms"])]
    filed["digest"] = [cron_digest_of_entry(r) for r in named_rows(filed)]
    filed["sid"] = [bytes(s) for s in filed["sid"]]
    index = shard.index()
    for sid, due_ms, delivery_id, version_digest in zip(
        filed["sid"], filed["due_ms"], filed["delivery_id"], filed["digest"]
    ):
        index.put(sid, IndexEntry(int(due_ms), delivery_id, version_digest))
    return with_entry_dtypes(filed[ENTRY_COLUMNS])


def _hashable(key: tuple) -> tuple:
    expr, tz, start, end = key
    return expr, None if missing(tz) else tz, optional_int(start), optional_int(end)


def _per_distinct(function, exprs, zones) -> list:
    results: dict = {}
    out = []
    for e, z in zip(exprs, zones):
        key = (e, None if missing(z) else z)
        if key not in results:
            results[key] = function(e, z)
        out.append(results[key])
    return out
