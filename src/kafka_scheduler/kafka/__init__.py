"""Kafka around the job: the scheduler's topics and the destinations (topics.py), a local broker for development
and tests (local_broker.py) and the JVM jars it and Spark need (jars.py), librdkafka's log (client_log.py)."""
