# Two commands on a fresh machine: `make run` and `make test`. Both install what is missing first.
.PHONY: setup run test test-unit bench clean

setup:
	@scripts/setup.sh

run: setup
	.venv/bin/kafka-scheduler demo

test: setup
	.venv/bin/python -m pytest $(PYTEST_ARGS)

test-unit: setup
	.venv/bin/python -m pytest -m "not integration" $(PYTEST_ARGS)

clean:
	rm -rf .local checkpoints .pytest_cache
