"""The ``kafka-scheduler`` command (main.py) and what only it needs: the demo, submit and its package zip,
config show, the filter of the job's output."""
