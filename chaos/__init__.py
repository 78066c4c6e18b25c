"""The crash suite (`make chaos`, `kafka-scheduler chaos`): schedules in every dialect, the job killed with
SIGKILL and the broker restarted while they are ingested and delivered, every delivery checked against the
request log. plan.py decides what is sent when, checker.py judges the outcome (no Kafka, no Spark), suite.py
runs it against a real broker and the real job."""
