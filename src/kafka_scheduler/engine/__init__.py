"""The streaming job's engine: the query (query.py) and its Spark session (session.py), the rules and the state
layout (schedule.py, wheel.py, index_cache.py, wheel_processor.py), the writers (record_sink.py, timed_writer.py,
exactly_once.py) and the checkpoint (checkpoint.py)."""
