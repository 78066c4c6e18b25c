"""The Python workers' warm-up (engine/spark/warm_workers.py) runs to its end: one task per slot of the session through
the same kind of function as the state step. That the batches then use them (one Python daemon in a running job) is
tested in tests/integration/test_native_protocol.py; what they save is measured: docs/measurements.md."""

import logging

from kafka_scheduler.engine.spark.session import ROCKSDB_PROVIDER, STATE_STORE_PROVIDER
from kafka_scheduler.engine.spark.warm_workers import warm_python_workers


def test_the_warm_up_runs_through_the_state_processor_api(spark, caplog):
    caplog.set_level(logging.DEBUG, logger="kafka_scheduler.engine.spark.warm_workers")
    before = spark.conf.get(STATE_STORE_PROVIDER)
    spark.conf.set(STATE_STORE_PROVIDER, ROCKSDB_PROVIDER)  # as the job's session: transformWithState needs RocksDB
    try:
        thread = warm_python_workers(spark)
        thread.join(300)
    finally:
        spark.conf.set(STATE_STORE_PROVIDER, before)
    assert not thread.is_alive() and thread.warmed, caplog.text
