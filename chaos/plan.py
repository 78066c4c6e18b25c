"""What the crash suite sends, and when it kills: a pure function of the sizes and the seed.

Times are seconds from the plan's start (T0, a whole second, taken once the job is running). Every
schedule id gets an ADD; some get a REPLACE (new due time and value) and some a CANCEL, each sent at
least ``SUPERSEDE_LEAD_S`` before the due time of the version it supersedes, so that normally the job
reads it in time. Some schedules are already due when sent, some make up herds (all due at one
instant), some arrive in bursts; the faults are placed among them:

- ``ingest``: a burst of schedules is sent just before the kill, so the job is reading them;
- ``herd``: a herd falls due just before the kill, so the job is writing it;
- ``writes``: a kill while steady deliveries are due;
- ``broker``: the broker is stopped and started again on the same data and port.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SUPERSEDE_LEAD_S = 10.0  # replaces and cancels leave the job this long before the due time they act on
FIRST_FAULT_S = 30.0  # the first fault comes after the job has ingested for a while
RESTART_ALLOWANCE_S = 50.0  # least time between faults: a restart of the job takes 25-45 s on 2 cores
ALREADY_DUE_SHARE = 0.05
REPLACE_SHARE = 0.10
CANCEL_SHARE = 0.10
HERD_SHARE = 0.10  # per herd fault
BURST_SHARE = 0.10  # per ingest fault
FAULT_KINDS = ("ingest", "herd", "writes")
# Paces: "full" sends FULL_COUNT schedules by default (~300 requests/s over the default plan: on 2 cores the job falls
# behind, so most deliveries go out late and "never early" is hardly exercised); "keep-up" sends at most
# KEEP_UP_PER_S schedules per second of the plan (the default count follows from it; a larger --count stretches
# the plan), so that the job is ahead of its due times between the faults and the timed writer writes at the instant.
PACES = ("full", "keep-up")
FULL_COUNT = 100_000
KEEP_UP_PER_S = 60.0


@dataclass(frozen=True)
class PlannedRequest:
    at_s: float  # send time
    sid: str  # request id (the record key in every dialect)
    dialect: str
    seq: int  # 0 for the ADD, then 1, 2 for what follows it
    action: str  # "schedule", "replace" or "cancel"
    due_s: float | None  # None for a cancel; may be before at_s (already due)
    destination: int  # index of the destination topic

    @property
    def version(self) -> str | None:
        return None if self.action == "cancel" else f"v{self.seq}"


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str  # one of FAULT_KINDS, or "broker"


@dataclass
class Plan:
    requests: list[PlannedRequest]
    faults: list[Fault]
    herds: list[float]  # herd instants
    end_s: float  # the last due time
    counts: dict = field(default_factory=dict)


def fault_times(
    kills: int, broker_restarts: int, spread_s: float, allowance_s: float = RESTART_ALLOWANCE_S
) -> list[Fault]:
    """Kills cycle through ingest, herd and writes; the broker restarts come after the first kill."""
    kinds = [FAULT_KINDS[i % len(FAULT_KINDS)] for i in range(kills)]
    for n in range(broker_restarts):
        kinds.insert(min(len(kinds), 1 + 2 * n), "broker")
    gap = max(allowance_s, (spread_s - FIRST_FAULT_S) / (len(kinds) + 1)) if kinds else 0.0
    return [Fault(FIRST_FAULT_S + i * gap, kind) for i, kind in enumerate(kinds)]


def plan_end_s(kills: int, broker_restarts: int, spread_s: float, allowance_s: float = RESTART_ALLOWANCE_S) -> float:
    """The plan's last due time: the spread, or later if the faults need more room."""
    faults = fault_times(kills, broker_restarts, spread_s, allowance_s)
    return max(spread_s, (faults[-1].at_s if faults else 0.0) + allowance_s)


def paced(
    count: int | None,
    pace: str,
    kills: int,
    broker_restarts: int,
    spread_s: float,
    allowance_s: float = RESTART_ALLOWANCE_S,
) -> tuple[int, float]:
    """(count, spread_s) for a pace: at "keep-up" no more than KEEP_UP_PER_S schedules per second of the plan
    (``count`` None: as many as that allows; a larger count stretches the spread), the same faults either way."""
    if pace not in PACES:
        raise ValueError(f"unknown pace {pace!r}: one of {', '.join(PACES)}")
    if pace == "full":
        return (FULL_COUNT if count is None else count), spread_s
    if count is None:
        return round(KEEP_UP_PER_S * plan_end_s(kills, broker_restarts, spread_s, allowance_s)), spread_s
    return count, max(spread_s, count / KEEP_UP_PER_S)


def make_plan(
    count: int,
    kills: int,
    broker_restarts: int,
    spread_s: float,
    seed: int,
    dialects: list[str],
    destinations: int = 2,
    allowance_s: float = RESTART_ALLOWANCE_S,
) -> Plan:
    rng = random.Random(seed)
    faults = fault_times(kills, broker_restarts, spread_s, allowance_s)
    last_fault = faults[-1].at_s if faults else 0.0
    end_s = max(spread_s, last_fault + allowance_s)
    # A herd falls due on a whole second (karafka and ETF1 carry seconds, so their members fall due with the
    # rest), and its kill comes 0.05-0.4 s later, while the writer is writing it.
    herds = [float(int(f.at_s)) for f in faults if f.kind == "herd"]
    faults = [Fault(int(f.at_s) + round(rng.uniform(0.05, 0.4), 2), f.kind) if f.kind == "herd" else f for f in faults]
    bursts = [f.at_s - rng.uniform(1.0, 3.0) for f in faults if f.kind == "ingest"]

    requests: list[PlannedRequest] = []
    counts = {"schedules": count, "already_due": 0, "herd": 0, "burst": 0, "replaces": 0, "cancels": 0}
    herd_size = int(count * HERD_SHARE)
    burst_size = int(count * BURST_SHARE)
    in_herds = herd_size * len(herds)
    for i in range(count):
        dialect = dialects[i % len(dialects)]
        sid = f"{dialect}-{i:07d}"
        destination = rng.randrange(destinations)
        in_herd = i < in_herds
        burst_index = (i - in_herds) // max(1, burst_size)
        if in_herd:
            due = herds[i // herd_size]
            at = rng.uniform(0.0, max(0.0, due - 3 * SUPERSEDE_LEAD_S))
            counts["herd"] += 1
        elif burst_index < len(bursts):
            at = bursts[burst_index]
            due = rng.uniform(at + 1.0, end_s)
            counts["burst"] += 1
        elif rng.random() < ALREADY_DUE_SHARE:
            at = rng.uniform(0.0, end_s - 5.0)
            due = at - rng.uniform(0.0, 3.0)
            counts["already_due"] += 1
        else:
            at = rng.uniform(0.0, end_s - 5.0)
            due = rng.uniform(at + 1.0, end_s)
        at = max(0.0, at)
        requests.append(PlannedRequest(at, sid, dialect, 0, "schedule", due, destination))
        seq, last_at = 0, at

        def room(due: float, last_at: float) -> bool:  # fits no later than SUPERSEDE_LEAD_S before the due
            return due - SUPERSEDE_LEAD_S - last_at > 1.0

        roll = rng.random()
        if roll < REPLACE_SHARE and room(due, last_at):
            seq += 1
            last_at = rng.uniform(last_at + 0.5, due - SUPERSEDE_LEAD_S)
            # A herd member keeps the herd's instant; the others move, earlier or later.
            due = due if in_herd else rng.uniform(last_at + SUPERSEDE_LEAD_S + 1.0, max(end_s, last_at + 12.0))
            requests.append(PlannedRequest(last_at, sid, dialect, seq, "replace", due, destination))
            counts["replaces"] += 1
        # Cancels: CANCEL_SHARE of the ids, a fifth of them after a replace.
        cancelled = REPLACE_SHARE <= roll < REPLACE_SHARE + CANCEL_SHARE * 0.8 or roll < CANCEL_SHARE * 0.2
        if cancelled and room(due, last_at):
            seq += 1
            last_at = rng.uniform(last_at + 0.5, due - SUPERSEDE_LEAD_S)
            requests.append(PlannedRequest(last_at, sid, dialect, seq, "cancel", None, destination))
            counts["cancels"] += 1
    requests.sort(key=lambda r: (r.at_s, r.sid, r.seq))
    return Plan(requests, faults, herds, end_s, counts)
