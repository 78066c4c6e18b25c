"""Running and watching the scheduler job from outside, as a user would: the job as a child process (job_process.py),
its process tree (process_tree.py), topics read whole (topic_reader.py), waiting with deadlines (waiting.py).
Used by the demo (`make run`), the integration tests, the benchmarks (bench/) and the crash suite (chaos/)."""
