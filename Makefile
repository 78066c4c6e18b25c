# Two commands on a fresh machine: `make run` and `make test`. Both install what is missing first.
.PHONY: setup run lint format test test-unit dist bench chaos diagram clean

setup:
	@scripts/setup.sh

run: setup
	.venv/bin/kafka-scheduler demo

# ruff's lint and format check over the whole tree (configured in pyproject.toml); `make format` rewrites.
lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: setup
	.venv/bin/ruff check --fix .
	.venv/bin/ruff format .

# The whole suite on TEST_WORKERS pytest-xdist workers (each with its own broker): tests that share a job or a
# Spark session stay on one worker, the longest go first (tests/conftest.py; docs/testing.md). TEST_WORKERS=0: in
# this process, one test after the other. One file: make test PYTEST_ARGS=tests/integration/test_inspect.py
TEST_WORKERS ?= 2
test: lint
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

test-unit: lint
	.venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not integration" $(PYTEST_ARGS)

# The package as a zip for spark-submit --py-files (executors import the state processor from it); the same code
# builds the zip `kafka-scheduler submit` ships (src/kafka_scheduler/cli/package_zip.py).
dist: setup
	@.venv/bin/python -m kafka_scheduler.cli.package_zip dist/kafka_scheduler.zip

# All benchmark scenarios at the target sizes (over an hour: the 10M herd waits 21 minutes for its default lead; mixed at 10M took 32 minutes on 2026-12-02); figures go to bench/results/.
bench: setup
	.venv/bin/kafka-scheduler bench all

# The crash suite in both delivery modes at the pace at which the job keeps up (--pace keep-up: ~20,000 schedules
# in every dialect, 60/s, so deliveries are written at their instant and an early one would show), 5 kills -9 of the
# job and one broker restart, every delivery checked (about 7 minutes a mode); figures go to chaos/results/.
# Options: CHAOS_ARGS="--seed 7"; CHAOS_ARGS="--pace full" for 100,000 at ~300 requests/s (the job falls behind).
chaos: setup
	.venv/bin/kafka-scheduler chaos --pace keep-up $(CHAOS_ARGS)

# The flow diagram of the README, re-rendered from its source with Graphviz (apt-get install graphviz).
diagram:
	dot -Tsvg docs/flow.dot -o docs/flow.svg

clean:
	rm -rf .local checkpoints .pytest_cache
