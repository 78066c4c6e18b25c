"""The crash suite's checker on hand-made request logs: each rule it enforces, broken once."""

from chaos.checker import Delivery, Sent, check, value_for
from chaos.plan import SUPERSEDE_LEAD_S, make_plan

DUE = 1_000_000


def schedule(sid, seq=0, due=DUE, committed=DUE - 20_000, action=None):
    version = f"v{seq}"
    return Sent(
        sid,
        seq,
        action or ("schedule" if seq == 0 else "replace"),
        version,
        due,
        sid.encode(),
        value_for(sid, version, 3),
        committed,
    )


def cancel(sid, seq, committed):
    return Sent(sid, seq, "cancel", committed_ms=committed)


def delivered(request, at=DUE + 50, delivery_id=b"requests-0-1", value=None):
    return Delivery(request.key, value if value is not None else request.value, at, delivery_id, "out-0@0")


def test_a_clean_run_passes_and_counts():
    a, b0, b1, c = schedule("a"), schedule("b"), schedule("b", 1, DUE + 5_000), schedule("c")
    verdict = check(
        [a, b0, b1, c, cancel("c", 1, DUE - 15_000)], [delivered(a), delivered(b1, DUE + 5_001, b"requests-0-2")]
    )
    assert verdict.ok, verdict.failures
    assert verdict.figures["expected"] == 2 and verdict.figures["delivered"] == 2
    assert verdict.figures["cancelled"] == 1 and verdict.figures["duplicates"] == 0


def test_a_schedule_never_delivered_is_lost():
    verdict = check([schedule("a"), schedule("b")], [delivered(schedule("a"))])
    assert verdict.failures == {"lost": 1}
    assert verdict.examples["lost"][0]["sid"] == "b"


def test_a_delivery_before_its_due_time_is_early():
    a = schedule("a")
    verdict = check([a], [delivered(a, at=DUE - 1)])
    assert verdict.failures == {"early": 1}


def test_a_delivery_after_a_cancel_committed_before_the_due_time_fails():
    a = schedule("a")
    verdict = check([a, cancel("a", 1, committed=DUE - 1)], [delivered(a)])
    assert verdict.failures == {"cancelled_delivered": 1}


def test_a_cancel_not_seen_committed_before_the_due_time_allows_the_delivery():
    a = schedule("a")
    for committed in (DUE, DUE + 30_000, None):
        verdict = check([a, cancel("a", 1, committed)], [delivered(a)])
        assert verdict.ok, (committed, verdict.failures)
        assert verdict.figures["superseded_late_delivered"] == 1


def test_a_replaced_version_delivered_after_the_replace_was_committed_is_stale():
    old, new = schedule("a"), schedule("a", 1, DUE + 10_000, committed=DUE - 5_000)
    verdict = check([old, new], [delivered(old), delivered(new, DUE + 10_000, b"requests-0-9")])
    assert verdict.failures == {"stale_version": 1}


def test_the_latest_version_is_required_even_when_the_old_one_went_out():
    old, new = schedule("a"), schedule("a", 1, DUE + 10_000, committed=DUE + 1_000)
    assert check([old, new], [delivered(old)]).failures == {"lost": 1}
    assert check([old, new], [delivered(old), delivered(new, DUE + 10_000, b"r-0-9")]).ok


def test_a_delivery_whose_content_is_not_its_version_fails():
    a = schedule("a")
    tampered = value_for("a", "v0", 4)  # names the version, but not its bytes
    assert check([a], [delivered(a, value=tampered)]).failures == {"wrong_content": 1}
    assert check([a], [delivered(a), delivered(a, value=b"junk")]).failures == {"unknown_delivery": 1}


def test_duplicates_are_counted_and_must_share_the_delivery_id():
    a = schedule("a")
    same = check([a], [delivered(a), delivered(a, DUE + 900)])
    assert same.ok and same.figures["duplicates"] == 1
    differing = check([a], [delivered(a), delivered(a, DUE + 900, b"requests-0-2")])
    assert differing.failures == {"duplicate_id_mismatch": 1}
    assert check([a], [delivered(a, delivery_id=None)]).failures == {"missing_delivery_id": 1}


def test_duplicates_fail_only_when_none_are_expected():
    a = schedule("a")
    verdict = check([a], [delivered(a), delivered(a)], expect_no_duplicates=True)
    assert verdict.failures == {"duplicates": 1}


def test_the_plan_leaves_every_replace_and_cancel_its_lead():
    plan = make_plan(
        3_000,
        kills=5,
        broker_restarts=1,
        spread_s=240,
        seed=7,
        dialects=["native", "karafka", "etf1", "sky-avro", "sky-json"],
    )
    due: dict[str, float] = {}
    for request in sorted(plan.requests, key=lambda r: (r.sid, r.seq)):
        if request.seq > 0:
            assert request.at_s <= due[request.sid] - SUPERSEDE_LEAD_S
        if request.due_s is not None:
            due[request.sid] = request.due_s
    kinds = [f.kind for f in plan.faults]
    assert kinds.count("broker") == 1 and {"ingest", "herd", "writes"} <= set(kinds)
    assert plan.counts["replaces"] and plan.counts["cancels"] and plan.counts["already_due"]
    assert all(any(r.due_s == herd for r in plan.requests) for herd in plan.herds)
