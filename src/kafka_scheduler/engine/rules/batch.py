"""A shard's micro-batch: the requests of one handler call folded per id (``apply_requests``, latest request wins),
a timer's buckets ripened (``fire``), and what is written later than its max lateness marked expired.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

from .batch_result import BatchResult
from .buckets import is_coarse
from .cells import missing
from .cron_rules import DEFAULT_CRON_MIN_INTERVAL_MS, apply_cron_requests, register_fresh_crons
from .digests import digest, digest_of_entry
from .entries import entries_frame, named_rows, schedule_of_entry, with_entry_columns, with_entry_dtypes
from .fields import ENTRY_COLUMNS
from .index_cache import IndexEntry
from .schedule import Action, Outcome, Request, Schedule, completes, input_topic_of, is_cron, is_internal
from .shard import ShardTransaction
from .store import ShardStore


def step(pending, pending_digest: bytes | None, request: Request):
    """One request against the id's pending version (an IndexEntry while unchanged, else a Schedule):
    its outcome, and the pending version and digest after it. Latest request wins."""
    if request.action is Action.CANCEL:
        return (Outcome.CANCEL_NOOP if pending is None else Outcome.CANCELLED), None, None
    if request.action is Action.COMPLETE:
        if pending is not None and completes(request, pending.delivery_id):
            return Outcome.COMPLETED, None, None
        return Outcome.COMPLETE_NOOP, pending, pending_digest
    new_digest = digest(request.schedule)
    if pending is None:
        return Outcome.SCHEDULED, request.schedule, new_digest
    if pending_digest == new_digest:
        return Outcome.REPLACE_NOOP, pending, pending_digest
    return Outcome.REPLACED, request.schedule, new_digest


def mark_expired(frame: pd.DataFrame, now_ms: int) -> pd.DataFrame:
    """Rows written at ``now_ms`` later than their due time plus their max lateness get ``expired`` True (the
    column appears only when one does): the sink and the timed writer reject them as expired. A row prepared
    ahead (due after now) is judged again when the writer writes it."""
    lateness = frame.get("max_lateness_ms")
    if lateness is None or not len(frame):
        return frame
    limit = pd.to_numeric(lateness, errors="coerce")
    if limit.isna().all():
        return frame
    late = (now_ms - frame["due_ms"].astype("int64") > limit).fillna(False).to_numpy(dtype=bool)
    if not late.any():
        return frame
    return frame.assign(expired=late)


def expired_mask(frame: pd.DataFrame) -> np.ndarray:
    if "expired" not in frame:
        return np.zeros(len(frame), dtype=bool)
    return frame["expired"].fillna(False).to_numpy(dtype=bool)


def apply_requests(
    store: ShardStore,
    requests: Iterable[tuple[bytes, Request]],
    now_ms: int,
    anonymous: pd.DataFrame | None = None,
    window_ms: int = 0,
    run: str = "",
    keyed: pd.DataFrame | None = None,
    cron_adds: pd.DataFrame | None = None,
    started_ms: int | None = None,
    cron_min_interval_ms: int = DEFAULT_CRON_MIN_INTERVAL_MS,
) -> BatchResult:
    """One shard's requests of a micro-batch at batch time ``now_ms``.

    Emits the schedules due by ``now_ms`` once all of the batch's requests acted (they leave state), and
    prepares those due by ``now_ms + window_ms``: emitted for the timed writer of run ``run`` but kept in
    state until a fire after their due time retires them, so a crash before the writer wrote them loses
    nothing. A replace or cancel of a version the writer may hold withdraws it.

    ``requests`` are those with a client id (one-shots and crons), in log order per id. ``anonymous`` holds the ADDs
    without request id (ENTRY_COLUMNS): nothing can replace or cancel them, so they skip the
    index and are filed in bulk (an optional ``src_topic`` column names their input topic for the counts
    per topic; their ids are not kept). ``keyed`` (ENTRY_COLUMNS, digest not needed) holds ADDs and
    REPLACEs with a client id that no other request of the batch names: those whose id has no
    pending version (the usual case) are filed in bulk too, without a Schedule per row (``src_topic``, optional,
    as for ``anonymous``). ``cron_adds`` (ENTRY_COLUMNS and ``raw_headers``) holds CRON_ADDs likewise.
    ``started_ms``: when the running job started (skip crons' firings due before it were missed).
    """
    by_sid: dict[bytes, list[Request]] = {}
    for sid, request in requests:
        by_sid.setdefault(sid, []).append(request)
    has_anonymous = anonymous is not None and len(anonymous) > 0
    has_keyed = keyed is not None and len(keyed) > 0
    has_cron_adds = cron_adds is not None and len(cron_adds) > 0
    result = BatchResult()
    if not by_sid and not has_anonymous and not has_keyed and not has_cron_adds:
        return result

    shard = ShardTransaction(store, store.next_seq(), now_ms, window_ms, run, started_ms=started_ms)
    outcomes, by_topic = result.outcomes, result.by_topic
    due_now: list[Schedule] = []
    to_file: tuple[list[Schedule], list[tuple]] = ([], [])  # not due yet: (schedules, (sid, digest) of each)
    index = shard.index()
    fresh = fresh_crons = None
    if has_keyed or has_cron_adds:
        entries = index.entries()
    if has_keyed:
        known = np.fromiter((bytes(sid) in entries for sid in keyed["sid"]), dtype=bool, count=len(keyed))
        for r in named_rows(keyed[known]):  # a version is pending: the rules, one by one
            by_sid[bytes(r.sid)] = [Request(Action(r.action), schedule_of_entry(r))]
        fresh = keyed[~known]
    if has_cron_adds:
        known = np.fromiter((bytes(sid) in entries for sid in cron_adds["sid"]), dtype=bool, count=len(cron_adds))
        for r in named_rows(cron_adds[known]):  # a cron has the id (active or paused): one by one
            by_sid[bytes(r.sid)] = [
                Request(Action.CRON_ADD, schedule_of_entry(r), raw_headers=r.raw_headers, activation=r.delivery_id)
            ]
        fresh_crons = cron_adds[~known]
    cron_sids = {sid: of_sid for sid, of_sid in by_sid.items() if is_cron(sid)}
    for sid, of_sid in by_sid.items():
        if sid in cron_sids:
            continue
        internal = is_internal(sid)
        topic = input_topic_of(sid)
        current = None if internal else index.get(sid)
        written = None
        if current is not None and shard.written(current):
            # Written at its due time: gone for the rules. Its entry stays until a fire retires it, unless a
            # new version takes the id first (then it is struck, so that a rebuild from the chunks agrees).
            written, current = current, None
        pending, pending_digest = current, (current.digest if current is not None else None)
        for request in of_sid:
            outcome, pending, pending_digest = step(pending, pending_digest, request)
            outcomes[outcome] += 1
            by_topic[(outcome, topic)] += 1

        if pending is current:
            continue
        if current is not None:
            shard.strike(current)
            if shard.may_be_held(current):
                result.withdrawn.append(current.delivery_id)
        if written is not None:
            shard.strike(written)
        if pending is not None and pending.due_ms <= now_ms:
            due_now.append(pending)
            result.at_once[topic] += 1
            pending = None
        if pending is None:
            if current is not None or written is not None:
                index.remove(sid)
            continue
        schedules, ids = to_file
        schedules.append(pending)
        if internal:
            ids.append((None, None))
        else:
            ids.append((sid, pending_digest))
            index.put(sid, IndexEntry(pending.due_ms, pending.delivery_id, pending_digest))
    if cron_sids:
        apply_cron_requests(shard, cron_sids, result, to_file, cron_min_interval_ms)

    to_place = [entries_frame(*to_file)] if to_file[0] else []
    if due_now:
        result.emitted.append(entries_frame(due_now))
    bulk, bulk_topics = [], []
    if has_anonymous:
        if "src_topic" in anonymous:
            bulk_topics.append(anonymous["src_topic"].to_numpy())
            anonymous = anonymous.drop(columns=["src_topic"])
        else:
            bulk_topics.append(np.full(len(anonymous), "", dtype=object))
        bulk.append(with_entry_dtypes(anonymous.assign(sid=None, digest=None) if "sid" not in anonymous else anonymous))
    if fresh is not None and len(fresh):
        fresh_later = (fresh["due_ms"] > now_ms).to_numpy()
        digests = np.full(len(fresh), None, dtype=object)
        for i, r in zip(np.flatnonzero(fresh_later), named_rows(fresh[fresh_later])):
            digests[i] = digest_of_entry(r)
            index.put(bytes(r.sid), IndexEntry(int(r.due_ms), r.delivery_id, digests[i]))
        bulk.append(
            with_entry_dtypes(fresh[ENTRY_COLUMNS].assign(digest=digests, sid=[bytes(s) for s in fresh["sid"]]))
        )
        bulk_topics.append(
            fresh["src_topic"].to_numpy()
            if "src_topic" in fresh
            else np.array([input_topic_of(s) for s in fresh["sid"]], dtype=object)
        )
    if bulk:
        rows = pd.concat(bulk, ignore_index=True) if len(bulk) > 1 else bulk[0]
        rows = with_entry_columns(rows)
        outcomes[Outcome.SCHEDULED] += len(rows)
        due_mask = rows["due_ms"] <= now_ms
        topics = np.concatenate(bulk_topics)
        # Counted in Python: a small batch's value_counts cost ~0.7 ms each (missing topics left out, as there).
        for topic, n in Counter(topics.tolist()).items():
            if not missing(topic):
                by_topic[(Outcome.SCHEDULED, topic)] += n
        for topic, n in Counter(topics[due_mask.to_numpy()].tolist()).items():
            if not missing(topic):
                result.at_once[topic] += n
        if due_mask.any():
            result.emitted.append(rows[due_mask].reset_index(drop=True))
        later = rows[~due_mask]
        if len(later):
            to_place.append(later)
    if fresh_crons is not None and len(fresh_crons):
        filed = register_fresh_crons(shard, fresh_crons, result, cron_min_interval_ms)
        if filed is not None:
            to_place.append(filed)
    if to_place:
        # All of the call's schedules placed at once: which seconds are dense is judged over all of them.
        rows = pd.concat(to_place, ignore_index=True) if len(to_place) > 1 else to_place[0]
        result.emitted.extend(shard.file_frames(shard.place(rows)))
    result.emitted.extend(shard.advance_crons())
    result.emitted = [mark_expired(frame, now_ms) for frame in result.emitted]
    result.skipped = shard.skipped
    shard.flush()
    return result


def fire(
    store: ShardStore,
    timer_ms: int,
    now_ms: int,
    window_ms: int = 0,
    run: str = "",
    started_ms: int | None = None,
    counts: Counter | None = None,
) -> Iterator[pd.DataFrame]:
    """A timer expired at batch time ``now_ms``: ripen each bucket it is the live timer of (see
    ``ShardTransaction.ripen``), yielding what it emits (rows written later than their max lateness marked
    ``expired``), then the next firings of the crons whose firing left state. ``counts``: gets the firings skipped
    (``skipped``)."""
    buckets = store.armed_get(timer_ms)
    if not buckets:
        return
    store.armed_remove(timer_ms)
    shard: ShardTransaction | None = None
    for bucket in sorted(set(buckets)):
        info = store.bucket_get(bucket)
        if info is None or info.timer_ms != timer_ms:
            continue  # emptied, or re-armed since: this timer is stale for it
        if shard is None:
            shard = ShardTransaction(store, store.next_seq(), now_ms, window_ms, run, lazy=True, started_ms=started_ms)
        shard.cache[bucket] = info
        for frame in (shard.refine if is_coarse(bucket) else shard.ripen)(bucket, info):
            yield mark_expired(frame, now_ms)
    if shard is not None:
        for frame in shard.advance_crons():
            yield mark_expired(frame, now_ms)
        if counts is not None and shard.skipped:
            counts["skipped"] += shard.skipped
        shard.flush()
