"""kafka-scheduler: delayed delivery for Apache Kafka on Spark Structured Streaming."""

__version__ = "0.1.0"
