"""The crash suite's paces (chaos/plan.py): keep-up sends at most KEEP_UP_PER_S schedules per second of the plan with
the same faults as full; the checker counts the deliveries written at their instant (chaos/checker.py)."""

from __future__ import annotations

import pytest

from chaos.checker import Delivery, Sent, check
from chaos.plan import FULL_COUNT, KEEP_UP_PER_S, fault_times, make_plan, paced, plan_end_s


def test_keep_up_sends_fewer_per_second_with_the_same_faults():
    full_count, full_spread = paced(None, "full", 5, 1, 240.0)
    keep_count, keep_spread = paced(None, "keep-up", 5, 1, 240.0)
    assert full_count == FULL_COUNT and full_spread == keep_spread == 240.0
    end = plan_end_s(5, 1, 240.0)
    assert keep_count == round(KEEP_UP_PER_S * end) < full_count / 4
    full, keep = (
        make_plan(full_count, 5, 1, full_spread, 7, ["native"]),
        make_plan(keep_count, 5, 1, keep_spread, 7, ["native"]),
    )
    assert [f.kind for f in full.faults] == [f.kind for f in keep.faults]
    assert len(keep.faults) == 6 and keep.end_s == full.end_s == end
    assert keep_count / keep.end_s <= KEEP_UP_PER_S


def test_a_larger_count_at_keep_up_stretches_the_plan_instead():
    count, spread = paced(60_000, "keep-up", 5, 1, 240.0)
    assert count == 60_000 and spread == 60_000 / KEEP_UP_PER_S
    plan = make_plan(count, 5, 1, spread, 7, ["native"])
    assert count / plan.end_s <= KEEP_UP_PER_S
    assert len(fault_times(5, 1, spread)) == 6
    # A small count is left as it is (the integration test's 2,000 over 2 minutes).
    assert paced(2_000, "keep-up", 2, 1, 120.0, 40.0) == (2_000, 120.0)
    with pytest.raises(ValueError):
        paced(None, "leisurely", 5, 1, 240.0)


def test_the_checker_counts_deliveries_written_at_their_instant():
    sent = [
        Sent("a", 0, "schedule", "v0", 1_000, b"a", b"a|v0|x"),
        Sent("b", 0, "schedule", "v0", 1_000, b"b", b"b|v0|x"),
    ]
    on_time = Delivery(b"a", b"a|v0|x", 1_050, b"id-a")
    late = Delivery(b"b", b"b|v0|x", 3_000, b"id-b")
    verdict = check(sent, [on_time, late])
    assert verdict.ok and verdict.figures["on_time"] == 1
    assert verdict.figures["lateness_p50_s"] == 2.0 and verdict.figures["lateness_p99_s"] == 2.0
    early = check(sent, [Delivery(b"a", b"a|v0|x", 990, b"id-a"), late])
    assert not early.ok and early.figures["early"] == 1 and early.figures["on_time"] == 0
