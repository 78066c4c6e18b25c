"""What runs in the driver process beside the streaming query: the sink of each micro-batch and the threads that act
between batches (the timed writer, the herd writer, the wake-ups, the CANCEL watcher)."""
