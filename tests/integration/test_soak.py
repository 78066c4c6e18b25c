"""`kafka-scheduler bench soak` at a size for the test suite: the same scenario as the hour-long soak (issue 18,
target 5), shortened with --duration and its windows: 40 s of 40 schedules/s with ids (replaced, cancelled), one
herd of 2,000, scrapes every 3 s. The figures are checked for what holds on any machine (nothing early, lost or
stale, every scrape answered, memory and checkpoint sampled in every window); lateness is machine-dependent and only
recorded. The rules of the figures: tests/unit/test_soak_figures.py."""

from __future__ import annotations

import argparse
import json

from bench import harness, scenarios


def test_a_short_soak_writes_its_figures_and_chart(broker, tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "RESULTS_DIR", tmp_path)
    parser = argparse.ArgumentParser()
    scenarios.add_arguments(parser)
    args = parser.parse_args(
        [
            "soak",
            "--duration",
            "40",
            "--rate",
            "40",
            "--window",
            "10",
            "--warm-up",
            "10",
            "--herd-every",
            "30",
            "--herd-count",
            "2000",
            "--due-max",
            "15",
            "--grace",
            "10",
            "--scrape-every",
            "3",
            "--bootstrap-servers",
            broker.bootstrap_servers,
        ]
    )
    figures = scenarios.run_one("soak", args)
    (result,) = tmp_path.glob("*-soak.json")
    record = json.loads(result.read_text())
    assert result.with_suffix(".png").stat().st_size > 10_000
    report = json.dumps(figures)
    assert figures["schedules_sent"] >= 1_500, report
    assert figures["all_due"] > 1_000 and figures["all_delivered"] == figures["all_due"], report
    for name in (
        "all_lost",
        "all_early",
        "all_stale_delivered",
        "all_cancelled_delivered",
        "unknown_deliveries",
        "scrape_failures",
    ):
        assert figures[name] == 0, (name, report)
    assert figures["replaces_and_cancels_sent"] > 0 and figures["herds_early_or_lost"] == [], report
    (herd,) = record["details"]["herd_figures"]
    assert herd["delivered"] == herd["sent"] == 2_000, herd
    windows = record["details"]["windows"]
    assert len(windows) == 4
    for window in windows:
        assert window["samples"] >= 2 and window["jvm_mean_mib"] > 100, window
        assert 10 < window["jvm_heap_used_min_mib"] <= window["jvm_heap_used_max_mib"] < window["jvm_mean_mib"], window
        # A first window may see a checkpoint under 50 KiB, which is 0.0 in MiB to one decimal.
        assert window["python_driver_mean_mib"] > 20 and window["checkpoint_bytes_mean_mib"] >= 0, window
    assert windows[-1]["checkpoint_bytes_max_mib"] > 0, windows[-1]
    assert record["parameters"]["duration"] == 40 and record["details"]["flat"]["jvm"] is not None
