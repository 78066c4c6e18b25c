"""The early path's frontier after a restart (engine/driver/prepared_horizon.py): versions an earlier run prepared
come back at their due time, so until a batch's time has passed everything earlier runs prepared, a committed batch
has handed over only what is due by its own time, not a lookahead more."""

from __future__ import annotations

from kafka_scheduler.engine.driver.prepared_horizon import FILE, SLACK_MS, UNKNOWN_BOUND_MS, PreparedHorizon
from kafka_scheduler.engine.spark.checkpoint import LocalFiles

LOOKAHEAD = 3_000


def test_a_new_checkpoint_has_no_earlier_run_and_the_frontier_is_a_lookahead_ahead(tmp_path):
    horizon = PreparedHorizon.read(LocalFiles(tmp_path), resumed=False, now_ms=1_000)
    assert horizon.earlier_runs_ms is None
    assert horizon.frontier_ms(5_000, LOOKAHEAD) == 8_000


def test_what_a_run_prepared_holds_the_next_runs_frontier_at_the_batch_time_until_passed(tmp_path):
    files = LocalFiles(tmp_path)
    first = PreparedHorizon.read(files, resumed=False, now_ms=0)
    first.note(100_000)
    first.note(None)
    restarted = PreparedHorizon.read(files, resumed=True, now_ms=50_000)
    assert restarted.earlier_runs_ms == 100_000 + SLACK_MS
    assert restarted.frontier_ms(60_000, LOOKAHEAD) == 60_000
    assert restarted.frontier_ms(100_000 + SLACK_MS, LOOKAHEAD) == 100_000 + SLACK_MS + LOOKAHEAD


def test_the_bound_is_written_only_when_a_batch_prepares_beyond_it(tmp_path):
    files = LocalFiles(tmp_path)
    horizon = PreparedHorizon.read(files, resumed=False, now_ms=0)
    horizon.note(10_000)
    written = (tmp_path / FILE).stat().st_mtime_ns
    (tmp_path / FILE).write_bytes(b'{"prepared_until_ms": 1}')  # what a rewrite would replace
    horizon.note(10_000 + SLACK_MS)  # within the bound: not written
    assert (tmp_path / FILE).read_bytes() == b'{"prepared_until_ms": 1}' and written
    horizon.note(10_000 + SLACK_MS + 1)
    assert PreparedHorizon.read(files, resumed=True, now_ms=0).earlier_runs_ms == 10_001 + 2 * SLACK_MS


def test_a_resumed_checkpoint_without_the_file_or_with_a_broken_one_takes_a_bound_from_now(tmp_path):
    files = LocalFiles(tmp_path)
    assert PreparedHorizon.read(files, resumed=True, now_ms=7).earlier_runs_ms == 7 + UNKNOWN_BOUND_MS
    (tmp_path / FILE).write_bytes(b"not json")
    assert PreparedHorizon.read(files, resumed=True, now_ms=7).earlier_runs_ms == 7 + UNKNOWN_BOUND_MS
