import os

import pytest

# Jobs the tests start serve no metrics unless a test asks for a port (--metrics-port): the default port 9464 would
# clash between jobs running at once (tests, other checkouts on the same machine).
os.environ.setdefault("KAFKA_SCHEDULER_METRICS_PORT", "0")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
