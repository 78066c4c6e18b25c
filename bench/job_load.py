"""What several scenarios share about the job they load: a job started and warmed up (its first deliveries
already made), a burst of requests produced as fast as possible and waited for until the job has committed them, and
deliveries waited for and counted. (The scenarios' modules use them; none of those imports another.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

from .harness import DeliveryReader, Environment, RequestProducer, log, wait_until

FAR_FUTURE_MS = 30 * 86_400_000  # "due far in the future": a month ahead


def settle_and_count(reader: DeliveryReader, expected: int, timeout: float, what: str) -> None:
    """Wait for ``expected`` deliveries; on a timeout keep going (what is missing is counted as lost),
    and read a few seconds more so that duplicates arriving late are counted too."""
    try:
        wait_until(
            lambda: reader.poll() >= expected, timeout, what, progress=lambda: f"{reader.count:,} of {expected:,}"
        )
    except TimeoutError as exc:
        log(f"  {exc}: counting what arrived")
    settle_until = time.time() + 3
    while time.time() < settle_until:
        reader.poll(0.5)


def warmed_up(env: Environment, args, app_id: str | None = None, inputs: tuple = ()):
    """A started scheduler that has already delivered something: the first batches with data are slow
    (Python workers start, code paths warm up), and the figures should show the steady state."""
    app_id = app_id or f"bench-{uuid.uuid4().hex[:6]}"
    if inputs:
        inputs = ("--input", f"{app_id}-schedule-requests:native", *inputs)
    scheduler = env.scheduler(app_id, extra_args=(*inputs, *args.scheduler_args)).start()
    warm_topic = env.topic("warm-up", partitions=1)
    reader = DeliveryReader(env.bootstrap, warm_topic)
    producer = RequestProducer(env.bootstrap, f"{scheduler.app_id}-schedule-requests")
    for round_number in range(3):
        now = int(time.time() * 1000)
        for i in range(100):
            producer.add(warm_topic, now + 500, f"warm-up-{round_number}-{i}")
            producer.add(warm_topic, now + 500, None)
        producer.flush()
        wait_until(lambda n=round_number: reader.poll() >= 200 * (n + 1), 300, "the warm-up deliveries")
    reader.close()
    log("scheduler warmed up")
    return scheduler


def ingest_requests(
    env: Environment,
    scheduler,
    destination: str,
    count: int,
    due_ms: Callable[[int], int],
    prefix: str,
    time_budget: float,
    no_ids: bool = False,
    requests: str | None = None,
    dialect: str = "native",
    send: Callable[[RequestProducer, int], None] | None = None,
    finish_by: float | None = None,
    too_slow: str = "",
) -> dict:
    """Produce ``count`` requests as fast as possible and wait until the scheduler has committed them all.

    ``send(producer, i)`` sends the i-th request (default: an ADD due at ``due_ms(i)``). ``finish_by``
    (epoch s): give up with a RuntimeError (``too_slow`` says why it matters) as soon as the pace
    between commits, over at least 60 s, cannot commit them all by then.

    Returns the producer rate and the scheduler's acceptance rate, overall (from the first request
    sent to the last one committed) and between the first and the last commit seen (without the
    wait for the first batch).
    """
    requests = requests or f"{scheduler.app_id}-schedule-requests"
    base = scheduler.committed(requests)
    producer = RequestProducer(env.bootstrap, requests, dialect)
    if send is None:

        def send(producer_: RequestProducer, i: int) -> None:
            producer_.add(destination, due_ms(i), None if no_ids else f"{prefix}-{i}")

    progress_points: list[tuple[float, int]] = []
    started = time.time()
    what = (
        ("without request ids" if no_ids else "with unique request ids")
        if prefix != "mix"
        else "(adds, replaces and cancels)"
    )
    log(f"producing {count:,} {dialect} requests {what}")
    for i in range(count):
        send(producer, i)
        if i % 100_000 == 99_999:
            scheduler.sample_memory()
    producer.flush()
    produced_s = time.time() - started
    log(f"produced {count:,} in {produced_s:.1f}s ({count / produced_s:,.0f}/s); waiting for the scheduler")

    def progress() -> str:
        done = scheduler.committed(requests) - base
        return f"{done:,} of {count:,} committed ({done / max(1e-9, time.time() - started):,.0f}/s so far)"

    def committed_all() -> bool:
        done = scheduler.committed(requests) - base
        now = time.time()
        if done and (not progress_points or done > progress_points[-1][1]):
            progress_points.append((now, done))
        scheduler.sample_memory()
        if finish_by is not None and done < count and len(progress_points) >= 2:
            (t0, n0), (t1, n1) = progress_points[0], progress_points[-1]
            if now - t0 >= 60 and t1 > t0:
                pace = (n1 - n0) / (t1 - t0)
                if now + (count - done) / max(pace, 1e-9) > finish_by:
                    raise RuntimeError(
                        f"ingest too slow: {pace:,.0f}/s between commits ({done:,} of {count:,} committed); "
                        f"the rest would need {(count - done) / max(pace, 1e-9):,.0f}s, {finish_by - now:,.0f}s "
                        f"are left{too_slow}"
                    )
        return done >= count

    wait_until(committed_all, time_budget, "the requests to be committed", interval=0.2, progress=progress)
    finished = time.time()
    (t0, n0), (t1, n1) = progress_points[0], progress_points[-1]
    sustained = (n1 - n0) / (t1 - t0) if t1 > t0 else None
    return {
        "produced_per_s": round(count / produced_s),
        "accepted_per_s_overall": round(count / (finished - started)),
        "accepted_per_s_between_commits": round(sustained) if sustained else None,
        "commits_observed": len(progress_points),
        "ingest_seconds": round(finished - started, 1),
    }
