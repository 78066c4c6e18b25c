"""bench soak's figures: the ledger of what was sent and delivered, the figures and verdicts per window of a run,
and its chart (bench/soak.py runs the load and samples the job; tests/unit/test_soak_figures.py checks these rules).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from kafka_scheduler.harness import process_tree

LATENESS_P99_TARGET_S = 0.25  # issue 18, target 2
LATENESS_MAX_TARGET_S = 1.0
GROWTH_LIMIT = 0.05  # flat: at most 5% over the run after the warm-up

NONE = -1
FOLLOW_NONE, FOLLOW_REPLACE, FOLLOW_CANCEL = 0, 1, 2
_BATCH_LINE = re.compile(
    r"batch (\d+): (?:(\d+) requests \([^)]*\); )?(\d+) delivered.*"
    r"\[state ([\d.]+)s, write ([\d.]+)s\]"
)


# ---------------------------------------------------------------- what was asked, in arrays


class Ledger:
    """Every ordinary schedule and herd member as sent, and what was delivered of it; numpy arrays (an hour at
    500/s is 1.8 million ids), written by the sender and the delivery reader, read by the checks."""

    def __init__(self, capacity: int, herds: int, herd_count: int):
        self.capacity = capacity
        self.sent = 0
        self.due = np.zeros((capacity, 2), dtype=np.int64)  # due ms of v0 and v1 (0: no v1)
        self.follow = np.zeros(capacity, dtype=np.int8)  # FOLLOW_*
        self.follow_committed = np.full(capacity, NONE, dtype=np.int64)  # ms the follow-up was first seen committed
        self.follow_where: dict[int, tuple[str, int, int]] = {}  # id -> (topic, partition, offset) until looked up
        self.delivered = np.full((capacity, 2), NONE, dtype=np.int64)  # first append ms per version
        self.copies = np.zeros((capacity, 2), dtype=np.int32)
        self.herd_due = np.zeros(herds, dtype=np.int64)
        self.herd_sent = np.zeros(herds, dtype=np.int64)  # how many of each herd were sent
        self.herd_delivered = np.full((herds, max(herd_count, 1)), NONE, dtype=np.int64)
        self.herd_copies = np.zeros((herds, max(herd_count, 1)), dtype=np.int32)
        self.unknown = 0  # deliveries naming nothing sent

    def deliver(self, key: bytes, value: bytes, appended_ms: int) -> None:
        try:
            version = int(value[1:2]) if value and value[:1] == b"v" else 0
            if key[:1] == b"s":
                row, slots, copies = int(key[1:]), self.delivered, self.copies
                column = version
                if row >= self.sent or column > 1:
                    raise ValueError
            elif key[:1] == b"h":
                herd, member = key[1:].split(b"-")
                row, column = int(herd), int(member)
                slots, copies = self.herd_delivered, self.herd_copies
            else:
                raise ValueError
        except (ValueError, IndexError, TypeError):
            self.unknown += 1
            return
        copies[row, column] += 1
        if slots[row, column] == NONE or appended_ms < slots[row, column]:
            slots[row, column] = appended_ms


# ---------------------------------------------------------------- figures


def _percentiles(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"lateness_p50_s": None, "lateness_p99_s": None, "lateness_max_s": None}
    p50, p99 = np.percentile(values, [50, 99], method="nearest")
    return {
        "lateness_p50_s": round(float(p50), 3),
        "lateness_p99_s": round(float(p99), 3),
        "lateness_max_s": round(float(values.max()), 3),
    }


def ordinary_outcomes(ledger: Ledger) -> dict:
    """Per ordinary id and version: whether it must be delivered, may be, or must not be (chaos/checker.py's rule:
    a version whose replace or cancel was seen committed before its due time must not go out)."""
    n = ledger.sent
    due, delivered, follow = ledger.due[:n], ledger.delivered[:n], ledger.follow[:n]
    committed = ledger.follow_committed[:n]
    has_follow = follow != FOLLOW_NONE
    in_time = has_follow & (committed != NONE) & (committed < due[:, 0])
    # v0: required without a follow-up; forbidden if superseded in time; allowed otherwise.
    required0 = ~has_follow
    forbidden0 = in_time
    allowed0 = has_follow & ~in_time
    required1 = follow == FOLLOW_REPLACE
    return {
        "due": due,
        "delivered": delivered,
        "required0": required0,
        "forbidden0": forbidden0,
        "allowed0": allowed0,
        "required1": required1,
        "cancelled": follow == FOLLOW_CANCEL,
        "replaced": follow == FOLLOW_REPLACE,
        "copies": ledger.copies[:n],
    }


def window_figures(ledger: Ledger, t0_ms: int, start_s: float, end_s: float, checked_ms: int, grace_s: float) -> dict:
    """Figures of the ordinary versions due in [start_s, end_s) after T0; ``checked_ms``: deliveries read up to
    then (a required version not delivered by then, due more than the grace before it, is lost)."""
    o = ordinary_outcomes(ledger)
    lo, hi = t0_ms + int(start_s * 1000), t0_ms + int(end_s * 1000)
    due, delivered = o["due"], o["delivered"]
    figures: dict = {"start_s": round(start_s, 1), "end_s": round(end_s, 1)}
    lateness_parts, lost, beyond_grace, early, due_count = [], 0, 0, 0, 0
    for column, required in ((0, o["required0"]), (1, o["required1"])):
        in_window = (due[:, column] >= lo) & (due[:, column] < hi)
        mask = in_window & required
        due_count += int(mask.sum())
        got = delivered[mask, column]
        dues = due[mask, column]
        arrived = got != NONE
        lateness_parts.append((got[arrived] - dues[arrived]) / 1000)
        missing = ~arrived & (dues + grace_s * 1000 <= checked_ms)
        lost += int(missing.sum())
        beyond_grace += int((arrived & (got - dues > grace_s * 1000)).sum())
        any_delivered = in_window & (delivered[:, column] != NONE)
        early += int((delivered[any_delivered, column] < due[any_delivered, column]).sum())
    lateness = np.sort(np.concatenate(lateness_parts)) if lateness_parts else np.zeros(0)
    in_window0 = (due[:, 0] >= lo) & (due[:, 0] < hi)
    delivered0 = delivered[:, 0] != NONE
    figures.update(
        {
            "due": due_count,
            "delivered": len(lateness),
            **_percentiles(lateness),
            "early": early,
            "lost": lost,
            "beyond_grace": beyond_grace,
            "stale_delivered": int((in_window0 & o["forbidden0"] & o["replaced"] & delivered0).sum()),
            "cancelled_delivered": int((in_window0 & o["forbidden0"] & o["cancelled"] & delivered0).sum()),
            "superseded_late_delivered": int((in_window0 & o["allowed0"] & delivered0).sum()),
            "duplicates": int(
                np.clip(o["copies"][in_window0, 0] - 1, 0, None).sum()
                + np.clip(o["copies"][(due[:, 1] >= lo) & (due[:, 1] < hi), 1] - 1, 0, None).sum()
            ),
        }
    )
    return figures


def herd_figures(ledger: Ledger, herd: int, count: int, t0_ms: int) -> dict:
    due = int(ledger.herd_due[herd])
    sent = int(ledger.herd_sent[herd])
    got = ledger.herd_delivered[herd, :sent]
    arrived = got[got != NONE]
    figures = {
        "instant_s": round((due - t0_ms) / 1000, 1),
        "count": count,
        "sent": sent,
        "delivered": len(arrived),
        "lost": sent - len(arrived),
        "early": int((arrived < due).sum()),
        "duplicates": int(np.clip(ledger.herd_copies[herd, :sent] - 1, 0, None).sum()),
    }
    if len(arrived):
        figures.update(
            {
                "first_after_instant_s": round((int(arrived.min()) - due) / 1000, 3),
                "last_after_instant_s": round((int(arrived.max()) - due) / 1000, 3),
            }
        )
    return figures


def sample_windows(samples: list[dict], windows: list[tuple[float, float]]) -> list[dict]:
    """Memory, checkpoint size and scrapes of the samples taken in each window of wall time."""
    result = []
    for start, end in windows:
        inside = [s for s in samples if start <= s["t"] < end and s.get("job_running")]
        row: dict = {"samples": len(inside)}
        for name in (*process_tree.GROUPS[:3], "checkpoint_bytes", "largest_worker", "jvm_heap_used"):
            values = [s[name] for s in inside if name in s]
            mib = 2**20
            row[f"{name}_mean_mib"] = round(sum(values) / len(values) / mib, 1) if values else None
            row[f"{name}_max_mib"] = round(max(values) / mib, 1) if values else None
            row[f"{name}_min_mib"] = round(min(values) / mib, 1) if values else None
        row["workers_max"] = max((s.get("workers", 0) for s in inside), default=None)
        row["scrapes"] = 2 * len(inside)
        row["scrape_failures"] = sum(bool(s.get("metrics_error")) + bool(s.get("status_error")) for s in inside)
        row["scrape_max_s"] = max((max(s.get("metrics_s", 0), s.get("status_s", 0)) for s in inside), default=None)
        row["health"] = sorted({s["health"] for s in inside if s.get("health")})
        result.append(row)
    return result


def growth(samples: list[dict], name: str, after_s: float, end_s: float) -> dict | None:
    """The least-squares line through ``name``'s samples after ``after_s``: its value there and at ``end_s``, and
    the rise between them relative to the first (None with fewer than 3 samples)."""
    points = [(s["t"], s[name]) for s in samples if s.get("job_running") and s["t"] >= after_s and name in s]
    if len(points) < 3:
        return None
    t = np.array([p[0] for p in points], dtype=float)
    v = np.array([p[1] for p in points], dtype=float)
    slope, intercept = np.polyfit(t, v, 1)
    at_start, at_end = slope * after_s + intercept, slope * end_s + intercept
    return {
        "fit_start_mib": round(at_start / 2**20, 1),
        "fit_end_mib": round(at_end / 2**20, 1),
        "growth_pct": round(100 * (at_end - at_start) / at_start, 2) if at_start > 0 else None,
        "samples": len(points),
    }


def batch_windows(lines: list[tuple[float, str]], t0: float, windows: list[tuple[float, float]]) -> list[dict]:
    """Per window of wall time, the job's logged batches: how many, and the longest state and write step."""
    batches = []
    for seen, line in lines:
        match = _BATCH_LINE.search(line)
        if match:
            batches.append((seen - t0, int(match.group(2) or 0), float(match.group(4)), float(match.group(5))))
    rows = []
    for start, end in windows:
        inside = [b for b in batches if start <= b[0] < end]
        rows.append(
            {
                "batches_logged": len(inside),
                "requests": sum(b[1] for b in inside),
                "batch_max_s": round(max((b[2] + b[3] for b in inside), default=0.0), 2),
                "state_max_s": round(max((b[2] for b in inside), default=0.0), 2),
            }
        )
    return rows


def verdicts(windows: list[dict], herds: list[dict], flat: dict) -> dict:
    # A window whose schedules were all lost has no lateness: missed too.
    late = [
        w["index"]
        for w in windows
        if w["due"] and (w["lateness_p99_s"] is None or w["lateness_p99_s"] > LATENESS_P99_TARGET_S)
    ]
    wrong = [w["index"] for w in windows if w["early"] or w["lost"] or w["stale_delivered"] or w["cancelled_delivered"]]
    grown = {
        name: f["growth_pct"]
        for name, f in flat.items()
        if f and f["growth_pct"] is not None and f["growth_pct"] > 100 * GROWTH_LIMIT
    }
    herd_wrong = [h["instant_s"] for h in herds if h["early"] or h["lost"]]
    scrape_failures = sum(w.get("scrape_failures") or 0 for w in windows)
    return {
        "windows_lateness_p99_met": f"{len(windows) - len(late)} of {len(windows)}",
        "windows_lateness_p99_missed": late,
        "windows_with_early_lost_stale_or_cancelled": wrong,
        "flat": "yes"
        if not grown and all(flat.values())
        else (
            "no: " + ", ".join(f"{k} +{v}%" for k, v in grown.items())
            if grown
            else "not enough samples after the warm-up"
        ),
        "herds_early_or_lost": herd_wrong,
        "scrape_failures": scrape_failures,
        "met": bool(windows)
        and not late
        and not wrong
        and not grown
        and all(flat.values())
        and not herd_wrong
        and not scrape_failures,
    }


def summarize(
    ledger: Ledger,
    samples: list[dict],
    job_log: list[tuple[float, str]],
    t0: float,
    duration: float,
    window: float,
    warm_up: float,
    grace: float,
    checked_ms: int,
    herd_instants: list[float],
    herd_count: int,
) -> dict:
    """The figures of a soak from what it recorded: per window, per herd, flatness, the verdicts; the series go in
    ``details`` (the result file keeps them, the chart draws them)."""
    t0_ms = int(t0 * 1000)
    spans = []
    start = 0.0
    while start < duration - 1e-6:
        spans.append((start, min(duration, start + window)))
        start += window
    windows = []
    memory_rows = sample_windows(samples, spans)
    batch_rows = batch_windows(job_log, t0, spans)
    for index, (start, stop) in enumerate(spans):
        windows.append(
            {
                "index": index,
                **window_figures(ledger, t0_ms, start, stop, checked_ms, grace),
                "herds": [h for h, instant in enumerate(herd_instants) if start <= instant < stop],
                **memory_rows[index],
                **batch_rows[index],
            }
        )
    herds = [herd_figures(ledger, herd, herd_count, t0_ms) for herd in range(len(herd_instants))]
    flat = {name: growth(samples, name, warm_up, duration) for name in (*process_tree.GROUPS[:3], "checkpoint_bytes")}
    verdict = verdicts(windows, herds, flat)
    total = window_figures(ledger, t0_ms, 0, duration, checked_ms, grace)
    running = [s for s in samples if s.get("job_running")]
    figures = {
        "verdict": "met" if verdict["met"] else "missed",
        **{k: v for k, v in verdict.items() if k != "met"},
        "schedules_sent": ledger.sent,
        "replaces_and_cancels_sent": int((ledger.follow[: ledger.sent] != 0).sum()),
        "herds": len(herds),
        "herd_count": herd_count,
        **{f"all_{k}": v for k, v in total.items() if k not in ("start_s", "end_s")},
        "worst_window_lateness_p99_s": max(
            (w["lateness_p99_s"] for w in windows if w["lateness_p99_s"] is not None), default=None
        ),
        "herd_last_after_instant_max_s": max((h.get("last_after_instant_s", 0) for h in herds), default=None),
        "unknown_deliveries": ledger.unknown,
        **{f"growth_{name}_pct": (f or {}).get("growth_pct") for name, f in flat.items()},
        "peak_rss_total_mib": round(
            max((sum(s.get(g, 0) for g in process_tree.GROUPS[:3]) for s in running), default=0) / 2**20
        ),
        "load_average_end": [round(v, 1) for v in os.getloadavg()],
    }
    figures["details"] = {
        "windows": windows,
        "herd_figures": herds,
        "flat": flat,
        "samples": samples,
        "targets": {
            "lateness_p99_s": LATENESS_P99_TARGET_S,
            "growth_pct": 100 * GROWTH_LIMIT,
            "warm_up_s": warm_up,
            "window_s": window,
            "duration_s": duration,
            "herd_instants_s": herd_instants,
        },
    }
    return figures


# ---------------------------------------------------------------- the chart


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def chart(result_path: Path) -> Path:
    """The PNG beside a soak result file: memory per process group, checkpoint size and lateness per window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    record = json.loads(Path(result_path).read_text())
    details = record["details"]
    windows, samples, targets = details["windows"], details["samples"], details["targets"]
    mid = [(w["start_s"] + w["end_s"]) / 120 for w in windows]  # minutes
    edges = [w["start_s"] / 60 for w in windows] + [windows[-1]["end_s"] / 60] if windows else []
    running = [s for s in samples if s.get("job_running")]
    t = [s["t"] / 60 for s in running]
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    memory, checkpoint, lateness = axes
    labels = {"jvm": "JVM", "python_driver": "Python driver", "python_workers": "Python workers (all)"}
    for group, colour in zip(labels, ("tab:blue", "tab:orange", "tab:green")):
        memory.plot(t, [s.get(group, 0) / 2**20 for s in running], color=colour, alpha=0.25, linewidth=0.8)
        if windows:
            memory.step(
                edges,
                [w[f"{group}_mean_mib"] or 0 for w in windows] + [windows[-1][f"{group}_mean_mib"] or 0],
                where="post",
                color=colour,
                linewidth=2,
                label=f"{labels[group]}, mean per window",
            )
    heap = [(s["t"] / 60, s["jvm_heap_used"] / 2**20) for s in running if "jvm_heap_used" in s]
    if heap:
        memory.plot(
            [h[0] for h in heap],
            [h[1] for h in heap],
            color="tab:blue",
            linestyle=":",
            linewidth=1,
            label="JVM heap in use (garbage included)",
        )
    memory.set_ylabel("resident memory (MiB)")
    memory.legend(loc="best", fontsize=8)
    memory.set_ylim(bottom=0)
    checkpoint.plot(
        t,
        [s.get("checkpoint_bytes", 0) / 2**20 for s in running],
        color="tab:purple",
        alpha=0.3,
        linewidth=0.8,
        label="every sample",
    )
    checkpoint.step(
        edges,
        [w["checkpoint_bytes_mean_mib"] or 0 for w in windows]
        + [windows[-1]["checkpoint_bytes_mean_mib"] or 0 for _ in windows[-1:]],
        where="post",
        color="tab:purple",
        linewidth=2,
        label="mean per window",
    )
    checkpoint.set_ylabel("checkpoint size (MiB)")
    checkpoint.legend(loc="best", fontsize=8)
    checkpoint.set_ylim(bottom=0)
    floor = 0.001
    for key, colour, label in (
        ("lateness_p50_s", "tab:green", "p50"),
        ("lateness_p99_s", "tab:orange", "p99"),
        ("lateness_max_s", "tab:red", "max"),
    ):
        lateness.plot(
            mid,
            [max(floor, w[key]) if w[key] is not None else None for w in windows],
            marker="o",
            color=colour,
            label=f"lateness {label} (schedules due in the window)",
        )
    lateness.axhline(
        targets["lateness_p99_s"],
        color="tab:orange",
        linestyle="--",
        linewidth=1,
        label=f"p99 target {targets['lateness_p99_s'] * 1000:.0f} ms",
    )
    lateness.set_yscale("log")
    lateness.set_ylabel("lateness (s, log)")
    lateness.set_xlabel("minutes since the load started")
    for herd in details["herd_figures"]:
        for axis in axes:
            axis.axvline(herd["instant_s"] / 60, color="grey", linestyle=":", linewidth=1)
        if herd.get("last_after_instant_s") is not None:
            lateness.plot(herd["instant_s"] / 60, max(floor, herd["last_after_instant_s"]), marker="^", color="grey")
    lateness.plot([], [], marker="^", color="grey", linestyle=":", label="herd instant; ^ its last delivery")
    lateness.legend(loc="best", fontsize=8)
    for axis in axes:
        axis.axvspan(0, targets["warm_up_s"] / 60, color="grey", alpha=0.08)
        axis.grid(True, alpha=0.3)
    f = record["figures"]
    wrong = f["windows_with_early_lost_stale_or_cancelled"]
    fig.suptitle(
        f"bench soak {record['finished_at']} ({record['git_commit'][:12]}), "
        f"{_span(targets['duration_s'])}: targets {f['verdict']}\n"
        f"lateness p99 <= {targets['lateness_p99_s'] * 1000:.0f} ms in {f['windows_lateness_p99_met']} "
        f"windows; {'windows with early/lost/stale: ' + str(wrong) if wrong else 'nothing early, lost or stale'}"
        f"\nflat after {_span(targets['warm_up_s'])}: {f['flat']}",
        fontsize=9,
    )
    fig.tight_layout()
    path = Path(result_path).with_suffix(".png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
