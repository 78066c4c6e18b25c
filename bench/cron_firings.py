"""bench cron: a million crons firing every minute, watched.

    kafka-scheduler bench cron --count 1000000 [--minutes 10]

--count crons (CRON_ADD, unique ids, Kaspr's headers written out by hand) all firing every minute
(`* * * * *`), watched for --minutes minutes from the first whole minute after they are all committed: per minute,
how many of them fired (each once: duplicates and losses counted exactly), none early, the first and last delivery
after the minute; once a minute, the live state (rows and bytes of each state variable, read as `inspect` reads
them), the id index and the job's memory (they should stay flat from minute 2 on: firings leave nothing behind),
and the checkpoint's size on disk by kind (it also keeps --state-batches-kept batches' versions). Deliveries are
counted on the broker while they come (end offsets) and read back at the end.
"""

from __future__ import annotations

import time

from .harness import (
    CronProducer,
    EndOffsets,
    Environment,
    FiringReader,
    LiveState,
    checkpoint_breakdown,
    directory_bytes,
    index_entries,
    log,
    percentile,
    wait_until,
)
from .job_load import ingest_requests, warmed_up

CRON_LAST_TARGET_S = 20.0  # cron: each minute's last firing at most this long after the minute


def cron(env: Environment, args) -> dict:
    """See the module's docstring."""
    scheduler = warmed_up(env, args)
    destination = env.topic("cron", partitions=4)
    log(f"cron: {args.count:,} crons firing every minute, watched for {args.minutes} minutes")
    ingest_figures = ingest_requests(
        env,
        scheduler,
        destination,
        args.count,
        lambda i: 0,
        "cron",
        args.time_budget,
        send=lambda producer, i: CronProducer.cron(producer, destination, f"cron-{i}", "* * * * *"),
    )
    first_minute = (int(time.time()) // 60 + 1) * 60 * 1000
    if first_minute - time.time() * 1000 < 10_000:
        first_minute += 60_000  # a minute that is whole: every cron's first firing is at or before it
    # The firings before it (crons registered early in the ingest) are delivered too; they are left out.
    minutes = [first_minute + 60_000 * k for k in range(args.minutes)]
    offsets = EndOffsets(env.bootstrap, destination)
    samples = []
    live_state: LiveState | None = None
    for k, minute in enumerate(minutes):
        # Counted from the minute itself: the firings of the minutes before it (crons registered during the ingest
        # fired then) are all on the broker by then, and a count taken earlier let a minute's wait end on them.
        time.sleep(max(0.0, minute / 1000 - time.time()))
        at_minute = offsets.total()
        try:
            wait_until(
                lambda at_minute=at_minute, minute=minute: (
                    offsets.total() >= at_minute + args.count or time.time() * 1000 > minute + 120_000
                ),
                (minute + 130_000) / 1000 - time.time(),
                f"minute {k}'s firings",
                progress=lambda at_minute=at_minute: f"{offsets.total() - at_minute:,} of {args.count:,}",
            )
        except TimeoutError as exc:
            log(f"  {exc}")
        index = index_entries(scheduler)
        memory = scheduler.sample_memory()
        # Read while the job waits for the next minute (a read takes seconds; the firings take under five).
        live_state = live_state or LiveState(scheduler.checkpoint)
        state = live_state.sample()
        samples.append(
            {
                "minute": k,
                "delivered_in_minute": offsets.total() - at_minute,
                "live_state": state,
                "live_state_mib": round(sum(v["mib"] for v in state.values() if isinstance(v, dict)), 1),
                "checkpoint_mib": round(directory_bytes(scheduler.checkpoint) / 2**20, 1),
                "checkpoint": checkpoint_breakdown(scheduler.checkpoint),
                "batches": state["batch"],
                "rss_mib": round(sum(memory.values()) / 2**20),
                "index_entries": index,
                **{f"rss_{name}_mib": round(v / 2**20) for name, v in memory.items()},
            }
        )
        log(f"  minute {k}: {samples[-1]}")
    scheduler.stop()
    if live_state:
        live_state.close()
    on_broker = offsets.total()
    offsets.close()
    log(f"reading every delivery back ({on_broker:,} records)")
    reader = FiringReader(env.bootstrap, destination, args.count)
    # To the end offsets (a quiet spell alone once ended the read before the last minute's million), or 60 s quiet.
    last_news, seen = time.time(), -1
    while reader.total < on_broker and time.time() - last_news < 60:
        reader.poll(1.0)
        if reader.total != seen:
            seen, last_news = reader.total, time.time()
    per_minute = []
    for k, minute in enumerate(minutes):
        fired = reader.fired(minute)
        per_minute.append(
            {
                "minute": k,
                "fired": fired,
                "lost": args.count - fired,
                "records": reader.records.get(minute, 0),
                "early": reader.early.get(minute, 0),
                "first_s": round((reader.first[minute] - minute) / 1000, 2) if minute in reader.first else None,
                "last_s": round((reader.last[minute] - minute) / 1000, 2) if minute in reader.last else None,
            }
        )
        log(f"  {per_minute[-1]}")
    reader.close()
    lasts = [m["last_s"] for m in per_minute if m["last_s"] is not None]
    later = [s for s in samples if s["minute"] >= 2]

    def spread(key: str):
        values = [s[key] for s in later if s.get(key) is not None]
        return round(max(values) / max(min(values), 1e-9), 2) if values else None

    return {
        "crons": args.count,
        "minutes": args.minutes,
        "all_fired_every_minute": all(m["lost"] == 0 for m in per_minute),
        "lost": sum(m["lost"] for m in per_minute),
        "duplicates": reader.duplicates,
        "early": sum(m["early"] for m in per_minute),
        "last_after_minute_max_s": max(lasts) if lasts else None,
        "last_after_minute_p50_s": round(percentile(sorted(lasts), 0.5), 2) if lasts else None,
        "minutes_last_within_target": sum(1 for v in lasts if v <= CRON_LAST_TARGET_S),
        "live_state_mib_max_over_min_from_minute_2": spread("live_state_mib"),
        "checkpoint_mib_max_over_min_from_minute_2": spread("checkpoint_mib"),
        "rss_max_over_min_from_minute_2": spread("rss_mib"),
        "ingest_accepted_per_s": ingest_figures["accepted_per_s_overall"],
        "details": {"per_minute": per_minute, "samples": samples},
    }
