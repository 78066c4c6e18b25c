"""The streaming job's engine, one subpackage per place its code runs:

* ``rules``: free of Spark, what a request does to a shard's state (the request model, the wheel state layout behind
  its ``ShardStore`` interface, crons, the id index); tested against a reference model without Spark.
* ``processor``: on Spark's executors, the state step (``transformWithStateInPandas``) over Spark's state store.
* ``driver``: in the driver process beside the query: the batch sink, the timed and herd writers, the CANCEL
  watcher, exactly-once's transactions, and the batch summaries.
* ``spark``: the Spark plumbing: the session, the streaming query, the checkpoint's files and settings.
"""
