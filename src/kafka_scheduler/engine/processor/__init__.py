"""The state step, run by Spark's Python workers on the executors: requests in, records out, over Spark's state
store."""
