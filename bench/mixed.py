"""bench mixed: a herd at one instant while ordinary schedules keep arriving, falling due and being cancelled.

    kafka-scheduler bench mixed [--count 1000000] [--ordinary-rate 200] [--lead S] [--after 30] [--cancels-keyed-apart]

A herd of --count schedules with ids, all due at one instant T, is sent first and waited for until the job has
committed it. From then on ordinary schedules arrive at --ordinary-rate per second with ids, each due 3 s after it
is sent; every 10th is cancelled 1 s after it was sent (keyed like it, or apart from it with
--cancels-keyed-apart): bench/ordinary.py. They keep coming until --after seconds past the herd's last delivery.
(They start once the herd is in: while a million requests are ingested every batch is an ingest batch, which is
`bench backlog`'s case, not this one.)

Figures for the ordinary schedules per window of their due time: "before" (until T - 30 s), "around" (T - 30 s until
the herd's last delivery) and "after": lateness p50/p99/max (broker append time - due time), early, lost (neither
cancelled nor delivered), cancels sent and cancelled schedules delivered anyway. For the herd: first and last delivery
after T, early, lost, duplicates. The job's batch durations (state + write, from its batch lines, by when they were
logged) per window, and the longest batch. The machine's load average at the start and the end.
"""

from __future__ import annotations

import os
import time

from .harness import INGEST_PLANNED_PER_S, DeliveryReader, EndOffsets, Environment, log
from .job_load import ingest_requests, warmed_up
from .ordinary import CANCEL_AFTER_S, CANCEL_EVERY, OrdinaryReader, OrdinaryTraffic, batch_figures, lateness_figures

ORDINARY_DUE_S = 3.0  # an ordinary schedule is due this long after it is sent
AROUND_BEFORE_S = 30.0  # the "around" window opens this long before the herd's instant
LEAD_SPARE_S = 60.0  # ... plus this, so that the "before" window has ordinary traffic of its own
WINDOWS = ("before", "around", "after")


def default_lead(count: int) -> float:
    return LEAD_SPARE_S + count / INGEST_PLANNED_PER_S


def window_of(due_ms: int, instant_ms: int, herd_last_ms: int) -> str:
    if due_ms < instant_ms - AROUND_BEFORE_S * 1000:
        return "before"
    return "around" if due_ms <= herd_last_ms else "after"


def ordinary_figures(
    sent: dict[bytes, int], cancelled: set[bytes], rows: list, instant_ms: int, herd_last_ms: int
) -> dict:
    """Per window of due time: lateness of the schedules not cancelled, early, lost, cancelled ones delivered."""
    delivered = {key: (appended, due) for key, appended, due in rows}
    return {
        window: lateness_figures(
            (k for k, due in sent.items() if window_of(due, instant_ms, herd_last_ms) == window), cancelled, delivered
        )
        for window in WINDOWS
    }


def mixed(env: Environment, args) -> dict:
    load_at_start = os.getloadavg()
    scheduler = warmed_up(env, args)
    requests = f"{scheduler.app_id}-schedule-requests"
    herd_topic = env.topic("herd", partitions=4)
    ordinary_topic = env.topic("ordinary")
    lead = args.lead if args.lead is not None else default_lead(args.count)
    instant_ms = int(time.time() * 1000 + lead * 1000)
    log(
        f"mixed: a herd of {args.count:,} due {lead:.0f}s from now; then ordinary schedules at "
        f"{args.ordinary_rate:g}/s, each due {ORDINARY_DUE_S:g}s after sending, every {CANCEL_EVERY}th cancelled "
        f"{CANCEL_AFTER_S:g}s after sending, until {args.after:g}s after the herd's last delivery"
    )
    too_slow = (
        f" before the herd falls due: give a longer --lead than {lead:.0f}s (the default plans ingest at "
        f"{INGEST_PLANNED_PER_S:,}/s)"
    )
    ingest = ingest_requests(
        env,
        scheduler,
        herd_topic,
        args.count,
        lambda i: instant_ms,
        "herd",
        max(1.0, instant_ms / 1000 - AROUND_BEFORE_S - time.time()),
        finish_by=instant_ms / 1000 - 1,
        too_slow=too_slow,
    )
    log(f"herd pending; due in {(instant_ms / 1000 - time.time()):.0f}s; ordinary traffic starts")

    reader = OrdinaryReader(env.bootstrap, ordinary_topic)
    traffic = OrdinaryTraffic(
        env.bootstrap, requests, ordinary_topic, args.ordinary_rate, (ORDINARY_DUE_S,), args.cancels_keyed_apart
    )
    herd_offsets = EndOffsets(env.bootstrap, herd_topic)
    started = time.time()
    herd_done_at = None
    give_up_at = instant_ms / 1000 + args.time_budget
    next_herd_check = 0.0
    while True:
        now = time.time()
        if herd_done_at is None and now >= next_herd_check:
            next_herd_check = now + 0.5
            if herd_offsets.total() >= args.count:
                herd_done_at = now
                log(
                    f"herd delivered ({now - instant_ms / 1000:.1f}s after its instant); ordinary traffic goes on "
                    f"for {args.after:g}s"
                )
            scheduler.assert_running()
        if (herd_done_at is not None and now >= herd_done_at + args.after) or now >= give_up_at:
            break
        wait = traffic.pace(now)
        reader.poll(0)
        time.sleep(min(0.002, max(0.0, wait)))
    traffic.finish()
    herd_offsets.close()
    if herd_done_at is None:
        log(f"  the herd was not all delivered within --time-budget {args.time_budget:.0f}s of its instant")
    traffic.wait_for_kept(reader, ORDINARY_DUE_S + 120)

    herd = DeliveryReader(env.bootstrap, herd_topic, compact=True)
    herd.read_until_quiet()
    appended = herd.appended()
    herd_last_ms = appended[-1] if appended else instant_ms
    herd_figures = herd.lateness_figures()
    figures = {
        "herd": {
            "count": args.count,
            "delivered": herd.count,
            "lost": args.count - herd.count,
            "early": herd_figures["early"],
            "duplicates": herd.duplicates,
            "first_after_instant_s": round((appended[0] - instant_ms) / 1000, 2) if appended else None,
            "last_after_instant_s": round((herd_last_ms - instant_ms) / 1000, 2) if appended else None,
            "deliveries_per_s": round(len(appended) / max(1e-9, (appended[-1] - appended[0]) / 1000))
            if len(appended) > 1
            else None,
            "ingest_accepted_per_s": ingest["accepted_per_s_overall"],
        },
        "ordinary": ordinary_figures(traffic.sent, traffic.cancelled, reader.rows, instant_ms, herd_last_ms),
        "ordinary_duplicates": reader.duplicates,
    }
    figures["batches"], longest = batch_figures(
        scheduler.follower.snapshot(),
        started,
        lambda seen: window_of(int(seen * 1000), instant_ms, herd_last_ms),
        WINDOWS,
    )
    if longest:
        longest["logged_after_instant_s"] = round(longest.pop("seen") - instant_ms / 1000, 1)
    figures["longest_batch"] = longest
    figures["load_average_at_start"] = [round(x, 1) for x in load_at_start]
    figures["load_average_at_end"] = [round(x, 1) for x in os.getloadavg()]
    reader.close()
    herd.close()
    scheduler.stop()
    figures["met"] = targets_met(figures)
    return figures


def targets_met(figures: dict) -> dict:
    """Issue 18 target 1, each part: ordinary p99 <= 1 s, 0 early and no cancelled one delivered in every window;
    the herd 0 early, 0 lost, first <= 1 s and last <= 15 s (1M) or 30 s (10M) after its instant."""
    herd = figures["herd"]
    last_limit = 15 if herd["count"] <= 1_000_000 else 30
    met = {
        f"ordinary_{w}": (
            o["lateness_p99_s"] is not None
            and o["lateness_p99_s"] <= 1.0
            and not o["early"]
            and not o["cancelled_delivered"]
            and not o["lost"]
        )
        for w, o in figures["ordinary"].items()
    }
    met["herd"] = (
        not herd["early"]
        and not herd["lost"]
        and herd["first_after_instant_s"] is not None
        and herd["first_after_instant_s"] <= 1.0
        and herd["last_after_instant_s"] <= last_limit
    )
    return met
