"""Python workers started, with the state processor's modules imported, while the query starts.

A job's first batch starts its Python workers cold: a daemon forks one per task and each imports pandas, pyarrow
and the processor before the first shard is handled, seconds of the first batch on a small machine. Spark keeps a
worker that finished a task for the next task started the same way, so a tiny transformWithStateInPandas run leaves
one warm worker per task slot for the first batch. (A mapInPandas job
does not: the state step's tasks start a daemon of their own.)"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

from pyspark.sql.streaming.stateful_processor import StatefulProcessor

log = logging.getLogger(__name__)


def warm_python_workers(spark) -> threading.Thread:
    """Run, in the background, one task per slot of the session that imports the processor's modules. The thread's
    ``warmed`` is True once they ran."""
    slots = max(1, spark.sparkContext.defaultParallelism)
    # The streams' manager starts the state stores' coordinator, which the task's state store looks for (it warns
    # when it is missing, as before the query starts).
    _ = spark.streams

    def run() -> None:
        try:
            spark.range(0, slots, 1, slots).groupBy("id").transformWithStateInPandas(
                _WarmProcessor(), "id long", "Append", "None"
            ).collect()
            thread.warmed = True
        except Exception as exc:  # only an optimisation: the first batch starts its workers itself
            log.debug("warming the Python workers failed: %s", exc)

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.warmed = False
    thread.start()
    return thread


class _WarmProcessor(StatefulProcessor):
    def init(self, handle) -> None:
        from ..processor import wheel_processor  # noqa: F401  (imported for its side effect: a warm interpreter)

    def handleInputRows(self, key, rows, timerValues) -> Iterator:
        for frame in rows:
            yield frame.iloc[:0]

    def close(self) -> None:
        pass
