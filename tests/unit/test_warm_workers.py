"""The Python workers' warm-up (engine/warm_workers.py) runs to its end: one task per slot of the session through
the same kind of function as the state step. Whether the first batch then finds them warm is measured, not tested:
docs/measurements.md, a job's first batch."""

import logging

from kafka_scheduler.engine.session import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER
from kafka_scheduler.engine.warm_workers import warm_python_workers


def test_the_warm_up_runs_through_the_state_processor_api(spark, caplog):
    caplog.set_level(logging.DEBUG, logger="kafka_scheduler.engine.warm_workers")
    before = spark.conf.get(STATE_STORE_PROVIDER)
    spark.conf.set(STATE_STORE_PROVIDER, ROCKSDB_PROVIDER)  # as the job's session: transformWithState needs RocksDB
    try:
        thread = warm_python_workers(spark)
        thread.join(300)
    finally:
        spark.conf.set(STATE_STORE_PROVIDER, before)
    assert not thread.is_alive() and thread.warmed, caplog.text
