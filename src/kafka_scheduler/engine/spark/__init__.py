"""The Spark plumbing: the session and its settings, the streaming query, the checkpoint's files and settings."""
