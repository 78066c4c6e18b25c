"""What a request does to a shard's state, free of Spark (nothing here imports pyspark): tested in milliseconds
against a reference model (tests/unit/test_schedule_rules.py)."""
