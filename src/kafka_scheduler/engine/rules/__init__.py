"""What a request does to a shard's state, free of Spark (nothing here imports pyspark): tested in milliseconds
against a reference model (tests/unit/test_schedule_rules.py).

* ``schedule.py``: the request model (schedules, requests, actions, outcomes);
* ``fields.py``: the columns of a schedule's row, each with its Arrow, pandas and Spark SQL types;
* ``batch.py``: a handler call's requests (``apply_requests``) and timers (``fire``); ``batch_result.py``: what the
  call hands to the sink;
* ``cron_rules.py``: the rules of recurring schedules; ``cron.py``: their expressions and instants;
* ``shard.py``: one call's transaction on a shard's state (``ShardTransaction``);
* ``store.py``: a shard's state, its layout and the ``ShardStore`` interface to it;
* ``buckets.py``: time buckets and their coarse levels; ``entries.py``: schedules as frames, ``cells.py``: their
  cells; ``digests.py``: what makes two versions identical; ``index_cache.py``: the id index in the worker's memory;
* ``partitioning.py``, ``rejection_classes.py``: a partition key's partition, and rejection reasons by class.
"""
