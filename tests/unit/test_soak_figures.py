"""bench soak's figures on a hand-made ledger (bench/soak_figures.py): the windows (lateness, early, lost, stale and
cancelled versions with the crash suite's committed-in-time rule), the herds, flatness, the verdicts, and the PNG
chart drawn from a result file. The scenario itself (a broker and the job for a short --duration) is
tests/integration/test_soak.py."""

from __future__ import annotations

import json

from PIL import Image

from bench.soak_figures import FOLLOW_CANCEL, FOLLOW_REPLACE, Ledger, chart, growth, summarize, window_figures

T0 = 1_000_000.0  # seconds
T0_MS = int(T0 * 1000)
MIB = 2**20


def ms(seconds: float) -> int:
    return T0_MS + int(seconds * 1000)


def deliver(ledger: Ledger, key: str, version: int, at_s: float) -> None:
    ledger.deliver(key.encode(), f"v{version}|{key}|....".encode(), ms(at_s))


def made_ledger() -> Ledger:
    ledger = Ledger(capacity=10, herds=1, herd_count=3)
    ledger.sent = 8
    dues = [1, 2, 3, 4, 5, 6, 7, 8]
    for row, due in enumerate(dues):
        ledger.due[row, 0] = ms(due)
    deliver(ledger, "s0", 0, 1.010)  # 10 ms late
    # s1: never delivered: lost
    deliver(ledger, "s2", 0, 2.5)  # 0.5 s early
    # s3: replaced, the replace committed before v0's due time: v0 must not go out; v1 (due at 20 s) must
    ledger.follow[3], ledger.due[3, 1], ledger.follow_committed[3] = FOLLOW_REPLACE, ms(20), ms(3)
    deliver(ledger, "s3", 0, 4.0)
    deliver(ledger, "s3", 1, 20.002)
    # s4: cancelled in time, delivered all the same
    ledger.follow[4], ledger.follow_committed[4] = FOLLOW_CANCEL, ms(4)
    deliver(ledger, "s4", 0, 5.0)
    # s5: cancelled, but the cancel was committed only after the due time: the delivery is allowed
    ledger.follow[5], ledger.follow_committed[5] = FOLLOW_CANCEL, ms(7)
    deliver(ledger, "s5", 0, 6.0)
    # s6: cancelled in time and not delivered: right; s7 delivered twice
    ledger.follow[6], ledger.follow_committed[6] = FOLLOW_CANCEL, ms(1)
    deliver(ledger, "s7", 0, 8.1)
    deliver(ledger, "s7", 0, 8.3)
    # the herd at 15 s: two of three delivered, one of them early
    ledger.herd_due[0], ledger.herd_sent[0] = ms(15), 3
    deliver(ledger, "h0-0", 0, 14.9)
    deliver(ledger, "h0-1", 0, 15.2)
    ledger.deliver(b"junk", b"v0|junk", ms(9))
    return ledger


def test_a_window_counts_each_rule_once():
    ledger = made_ledger()
    first = window_figures(ledger, T0_MS, 0, 10, checked_ms=ms(100), grace_s=30)
    assert first["due"] == 4  # s0, s1, s2, s7 (s3's v0 was superseded in time; s4-s6 cancelled)
    assert first["delivered"] == 3 and first["lost"] == 1 and first["early"] == 1
    assert first["stale_delivered"] == 1 and first["cancelled_delivered"] == 1
    assert first["superseded_late_delivered"] == 1 and first["duplicates"] == 1
    assert first["lateness_p50_s"] == 0.01 and first["lateness_max_s"] == 0.1
    second = window_figures(ledger, T0_MS, 10, 30, checked_ms=ms(100), grace_s=30)
    assert second["due"] == 1 and second["delivered"] == 1 and second["lateness_max_s"] == 0.002
    assert second["lost"] == second["early"] == 0
    # Not yet the grace after its due time: not lost yet.
    assert window_figures(ledger, T0_MS, 0, 10, checked_ms=ms(20), grace_s=30)["lost"] == 0
    assert ledger.unknown == 1


def samples(duration: float, every: float, rise: float) -> list[dict]:
    """Memory and checkpoint rising by ``rise`` (a share) over the run."""
    rows = []
    t = 0.0
    while t < duration:
        level = 1 + rise * t / duration
        rows.append(
            {
                "t": t,
                "job_running": True,
                "jvm": int(1000 * MIB * level),
                "python_driver": 200 * MIB,
                "python_workers": 300 * MIB,
                "workers": 2,
                "largest_worker": 150 * MIB,
                "checkpoint_bytes": int(50 * MIB * level),
                "metrics_s": 0.01,
                "status_s": 0.02,
                "metrics_error": None,
                "status_error": None,
                "health": "ok",
            }
        )
        t += every
    return rows


def test_growth_is_the_fitted_rise_after_the_warm_up():
    flat = growth(samples(600, 15, 0.0), "jvm", 100, 600)
    assert flat["growth_pct"] == 0.0
    rising = growth(samples(600, 15, 0.6), "jvm", 100, 600)
    # 1 + 0.6 t/600: from 1.1 at 100 s to 1.6 at 600 s
    assert abs(rising["growth_pct"] - 100 * 0.5 / 1.1) < 0.5
    assert growth(samples(600, 15, 0.0)[:2], "jvm", 0, 600) is None


def summary(rise: float) -> dict:
    log = [
        (T0 + 3.0, "12:00:03 INFO  batch 7: 40 requests (40 scheduled); 3 delivered [state 0.40s, write 0.10s]"),
        (T0 + 12.0, "12:00:12 INFO  batch 8: 2 delivered [state 0.20s, write 0.05s]"),
    ]
    return summarize(
        made_ledger(),
        samples(30, 1, rise),
        log,
        T0,
        duration=30,
        window=10,
        warm_up=5,
        grace=30,
        checked_ms=ms(100),
        herd_instants=[15.0],
        herd_count=3,
    )


def test_the_verdicts_name_what_missed():
    figures = summary(0.0)
    assert figures["verdict"] == "missed"
    assert figures["windows_with_early_lost_stale_or_cancelled"] == [0]
    assert figures["flat"] == "yes" and figures["herds_early_or_lost"] == [15.0]
    windows = figures["details"]["windows"]
    assert [w["herds"] for w in windows] == [[], [0], []]
    assert windows[0]["batches_logged"] == 1 and windows[0]["batch_max_s"] == 0.5
    assert windows[0]["jvm_mean_mib"] == 1000.0 and windows[0]["scrape_failures"] == 0
    herd = figures["details"]["herd_figures"][0]
    assert herd["delivered"] == 2 and herd["lost"] == 1 and herd["early"] == 1
    assert herd["first_after_instant_s"] == -0.1 and herd["last_after_instant_s"] == 0.2
    assert summary(0.5)["flat"].startswith("no: jvm +")


def test_the_chart_is_drawn_from_the_result_file(tmp_path):
    figures = summary(0.1)
    details = figures.pop("details")
    path = tmp_path / "20261127T000000Z-soak.json"
    path.write_text(
        json.dumps(
            {
                "scenario": "soak",
                "finished_at": "20261127T000000Z",
                "git_commit": "abc",
                "figures": figures,
                "details": details,
            }
        )
    )
    png = chart(path)
    assert png == tmp_path / "20261127T000000Z-soak.png"
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size[0] > 800


def test_a_soak_whose_job_ended_at_once_still_has_its_file_and_chart(tmp_path):
    """The job ended within the grace of the start: no window is covered, the samples are still drawn."""
    figures = summarize(
        made_ledger(),
        samples(30, 1, 0.0),
        [],
        T0,
        duration=0.0,
        window=10,
        warm_up=5,
        grace=30,
        checked_ms=ms(100),
        herd_instants=[],
        herd_count=3,
    )
    details = figures.pop("details")
    assert details["windows"] == [] and figures["verdict"] == "missed"
    path = tmp_path / "20261127T000000Z-soak.json"
    path.write_text(
        json.dumps(
            {
                "scenario": "soak",
                "finished_at": "20261127T000000Z",
                "git_commit": "abc",
                "figures": figures,
                "details": details,
            }
        )
    )
    with Image.open(chart(path)) as image:
        assert image.format == "PNG"
