"""How far ahead the runs of a checkpoint have prepared deliveries: the early path's frontier after a restart.

A batch hands the writers every version due by its time plus the lookahead, and the state marks them prepared by
this run (``BucketInfo``'s prepare mark). The next run does not take those marks for its own: such a version comes
back when its bucket's retire timer fires, at its due time, not a lookahead ahead. So in a new run "a committed
batch at t handed over everything due by t + lookahead" holds only for versions due after everything earlier runs
prepared; before that, only everything due by t is sure to have been handed over. An early version written on the
stronger claim could be identical to a version an earlier run prepared (the no-op REPLACE: the state keeps that
version and its id) and go out under a second id.

Each batch notes the latest due time it prepared; the checkpoint keeps an upper bound of it (``FILE``), written
before the batch commits, and rewritten only when a batch prepares beyond it (``SLACK_MS`` at a time). A checkpoint
written before this file existed: its runs' bound is unknown, and ``UNKNOWN_BOUND_MS`` after this start is taken
(a herd of millions is prepared minutes ahead at most).
"""

from __future__ import annotations

import json
import logging

from ..spark.checkpoint import CheckpointFiles

log = logging.getLogger(__name__)

FILE = "prepared-until"
SLACK_MS = 60_000
UNKNOWN_BOUND_MS = 600_000


class PreparedHorizon:
    """``earlier_runs_ms``: every version earlier runs prepared is due by then (None: no earlier run prepared any)."""

    def __init__(self, files: CheckpointFiles | None, earlier_runs_ms: int | None):
        self.files = files
        self.earlier_runs_ms = earlier_runs_ms
        self.recorded_ms = earlier_runs_ms or 0

    @classmethod
    def read(cls, files: CheckpointFiles, resumed: bool, now_ms: int) -> PreparedHorizon:
        raw = files.read(FILE)
        if raw is None:
            return cls(files, now_ms + UNKNOWN_BOUND_MS if resumed else None)
        try:
            return cls(files, int(json.loads(raw)["prepared_until_ms"]))
        except (ValueError, KeyError, TypeError):
            log.warning("checkpoint: %s unreadable; taking %d s from now as its bound", FILE, UNKNOWN_BOUND_MS // 1000)
            return cls(files, now_ms + UNKNOWN_BOUND_MS)

    def note(self, latest_prepared_due_ms: int | None) -> None:
        """A batch prepared deliveries due up to ``latest_prepared_due_ms``: recorded before it commits."""
        if latest_prepared_due_ms is None or latest_prepared_due_ms <= self.recorded_ms or self.files is None:
            return
        bound = latest_prepared_due_ms + SLACK_MS
        self.files.write(FILE, json.dumps({"prepared_until_ms": bound}).encode())
        self.recorded_ms = bound

    def frontier_ms(self, batch_time_ms: int, lookahead_ms: int) -> int:
        """What a committed batch at ``batch_time_ms`` has handed over everything due by (early_book.py)."""
        if self.earlier_runs_ms is not None and batch_time_ms < self.earlier_runs_ms:
            return batch_time_ms
        return batch_time_ms + lookahead_ms
