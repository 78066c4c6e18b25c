"""What one handler call's rules hand to the sink (``BatchResult``): outcome counts, the schedules emitted, the
delivery ids withdrawn from the timed writer, and the CRON_ADDs the rules refuse."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from .entries import schedules_of
from .rejection_classes import reason_class
from .schedule import Outcome, Schedule

# The columns of a frame of CRON_ADDs the rules refuse (``BatchResult.rejected``).
REJECTED_COLUMNS = ["key", "value", "raw_headers", "delivery_id", "reason"]


@dataclass
class BatchResult:
    """What one handler call hands to the sink."""

    outcomes: Counter = field(default_factory=Counter)
    # The same outcomes per input topic, (Outcome, topic) -> n (rejections: (Outcome.REJECTED, topic, reason class)),
    # and the schedules delivered at once (due when read) per input topic: for the metrics (ops/metrics.py).
    by_topic: Counter = field(default_factory=Counter)
    at_once: Counter = field(default_factory=Counter)
    # entries frames: due by now (write now) or later (prepared); a row marked ``expired`` (batch.mark_expired) is not
    # delivered but rejected as expired
    emitted: list = field(default_factory=list)
    withdrawn: list = field(default_factory=list)  # delivery ids the timed writer may hold and must drop
    # CRON_ADDs the rules refuse (expression, zone, interval): frames of REJECTED_COLUMNS
    rejected: list = field(default_factory=list)
    skipped: int = 0  # firings of skip crons missed while the job was down

    def schedules(self) -> list[Schedule]:
        """Every emitted schedule, expired ones too."""
        return [s for frame in self.emitted for s in schedules_of(frame)]

    def reject(self, topic: str, rows: list) -> None:
        """CRON_ADDs of input topic ``topic`` refused by the rules: (key, value, raw headers, delivery id, reason)
        each."""
        for row in rows:
            self.outcomes[Outcome.REJECTED] += 1
            self.by_topic[(Outcome.REJECTED, topic, reason_class(row[4]))] += 1
        self.rejected.append(pd.DataFrame(rows, columns=REJECTED_COLUMNS))
