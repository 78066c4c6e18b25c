import os
from pathlib import Path

import pytest

# Jobs the tests start serve no metrics unless a test asks for a port (--metrics-port): the default port 9464 would
# clash between jobs running at once (tests, other checkouts on the same machine).
os.environ.setdefault("KAFKA_SCHEDULER_METRICS_PORT", "0")

# The tests start some fifty Spark JVMs (jobs, the unit tests' session) that live for seconds or minutes: the C2
# compiler's work at start-up does not pay back in that time. C1 only and the serial collector halve the CPU of a
# Spark start (12 s -> 6 s) and took a third off three job files (181 s -> 123 s of CPU; docs/testing.md), on a
# suite whose two workers compete for 2 cores. spark-class reads SPARK_LAUNCHER_OPTS for its launcher JVM and
# SPARK_SUBMIT_OPTS for the driver's; jobs the tests start inherit both. Production runs keep the JVM's defaults.
C1_ONLY = "-XX:TieredStopAtLevel=1"
TEST_JVM_OPTIONS = f"{C1_ONLY} -XX:+UseSerialGC"
# The jobs the tests start see a few records a batch: Spark's generated code (Java source per plan and expression,
# compiled by Janino, then by the JIT) costs them more than it saves. Interpreted, a job start took 48 core-seconds
# against 56 and its first delivery came 27.5 s after the start against 31.7 (six starts each, docs/testing.md).
# What exists for the generated code keeps it: the unit tests' Spark session (the decoders' split plans,
# tests/unit/conftest.py) and the crash suite (test_chaos.py, production's JIT as well). Production keeps Spark's
# defaults. As system properties of the driver's JVM: Spark reads spark.* ones as settings.
INTERPRETED_SPARK = "-Dspark.sql.codegen.wholeStage=false -Dspark.sql.codegen.factoryMode=NO_CODEGEN"
TEST_SUBMIT_OPTIONS = f"{TEST_JVM_OPTIONS} {INTERPRETED_SPARK}"  # the jobs' driver JVMs (the class archive is added)
TEST_JVM_OPTIONS_SET_HERE = "SPARK_SUBMIT_OPTS" not in os.environ
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_SUBMIT_OPTIONS)
os.environ.setdefault("SPARK_LAUNCHER_OPTS", TEST_JVM_OPTIONS)
# The brokers too (one per worker, and those of the tests that restart or secure one): with full JIT and G1 they
# were 10% of the suite's CPU (docs/testing.md).
TEST_BROKER_JVM_OPTIONS = f"{TEST_JVM_OPTIONS} -Djava.awt.headless=true"
os.environ.setdefault("KAFKA_JVM_PERFORMANCE_OPTS", TEST_BROKER_JVM_OPTIONS)
# The jobs start on the suite's own class archive (SPARK_SUBMIT_OPTS, below): not on one of their own, nor does
# every graceful stop write one (test_class_archive.py turns it on).
os.environ.setdefault("KAFKA_SCHEDULER_CLASS_ARCHIVE", "off")

# Seconds each slow file took in the last full run (`make test`, 2 workers; docs/testing.md): `make test` hands
# out the longest work first, so the run does not end waiting on one long file started late. A file missing here
# counts as quick; refresh the figures when a file's time changes much (per-file sums of a --junitxml report).
EXPECTED_SECONDS = {
    "integration/test_chaos.py": 856,
    "integration/test_cron.py": 493,
    "integration/test_timed_writer.py": 436,
    "integration/test_restart.py": 420,
    "integration/test_edge_faults.py": 400,
    "integration/test_scale_out.py": 384,
    "integration/test_hostile_input.py": 335,
    "unit/test_schedule_rules.py": 325,
    "integration/test_dialect_rebuild.py": 317,
    "integration/test_native_protocol.py": 249,
    "unit/test_wheel_layout.py": 232,
    "integration/test_lookahead_change.py": 226,
    "unit/test_wheel_levels.py": 223,
    "integration/test_dialects.py": 203,
    "integration/test_exactly_once.py": 163,
    "integration/test_soak.py": 152,
    "integration/test_listing.py": 144,
    "integration/test_inspect.py": 140,
    "integration/test_status_page_actions.py": 119,
    "integration/test_state_settings.py": 109,
    "integration/test_hostile_dialects.py": 109,
    "integration/test_submit.py": 108,
    "integration/test_demo.py": 106,
    "integration/test_status_page.py": 94,
    "integration/test_metrics.py": 93,
    "integration/test_secured_kafka.py": 91,
    "integration/test_lookahead.py": 84,
    "integration/test_catch_up.py": 73,
    "unit/test_dialect_decode.py": 58,
    "integration/test_spark_submit.py": 57,
    "unit/test_hostile_decode.py": 51,
}
# Module-scoped fixtures that are cheap to set up again on another worker: they do not tie a file's tests together.
CHEAP_MODULE_FIXTURES = {"scheduler_factory"}
SPARK_GROUP = "unit-spark-session"


def file_key(item) -> str:
    """The test file's path below tests/, e.g. integration/test_chaos.py."""
    parts = item.path.parts
    return "/".join(parts[parts.index("tests") + 1 :]) if "tests" in parts else item.path.name


def xdist_group(item, spark_files: set) -> str | None:
    """What must run on one worker with this test: the unit test files that use the Spark session (one session
    for all of them, where each worker would start its own); its whole file when the tests share a module-scoped
    fixture (a job, a broker, a cluster started once for the file); None: the test can go to any worker alone."""
    if file_key(item) in spark_files:
        return SPARK_GROUP
    for name, definitions in item._fixtureinfo.name2fixturedefs.items():
        if (
            name not in CHEAP_MODULE_FIXTURES
            and definitions
            and definitions[-1].scope in ("module", "package", "class")
        ):
            return file_key(item)
    return None


def pytest_configure(config):
    """The Spark driver JVMs start on a class archive (tests/jvm_archive.py: a third less JVM CPU per job). Built
    here, before the workers start (they inherit the options), when the run may start jobs and none is there yet."""
    if hasattr(config, "workerinput") or not TEST_JVM_OPTIONS_SET_HERE:
        return
    from tests import jvm_archive

    archive = jvm_archive.ensure(TEST_JVM_OPTIONS, build=may_start_jobs(config))
    if archive is not None:
        os.environ["SPARK_SUBMIT_OPTS"] = f"{TEST_SUBMIT_OPTIONS} {jvm_archive.options(archive)}"


def may_start_jobs(config) -> bool:
    """Whether the run includes integration tests: unit-only runs use an archive that is there but build none."""
    if "not integration" in (config.getoption("markexpr", "") or ""):
        return False
    paths = [Path(a.split("::")[0]).resolve() for a in config.args] or [Path.cwd()]
    unit = Path(__file__).parent / "unit"
    return any(not path.is_relative_to(unit) for path in paths)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks (`make test`: --dist loadgroup)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/integration/" in str(item.path):
            item.add_marker(pytest.mark.integration)
    # A worker has --dist as "loadgroup" in its own option (its "dist" is "no").
    if not (config.getoption("loadgroup", False) or config.getoption("dist", "no") == "loadgroup"):
        return
    spark_files = {
        file_key(item) for item in items if file_key(item).startswith("unit/") and "spark" in item.fixturenames
    }
    groups = {}
    for item in items:
        group = xdist_group(item, spark_files)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        groups.setdefault(group or item.nodeid, []).append(item)

    tests_in: dict[str, int] = {}
    for item in items:
        tests_in[file_key(item)] = tests_in.get(file_key(item), 0) + 1

    def expected(unit: list) -> float:
        """The seconds of a unit of work: its tests' shares of their files' expected time."""
        return sum(EXPECTED_SECONDS.get(file_key(i), 0) / tests_in[file_key(i)] for i in unit)

    # Longest units first (xdist gives them out in collection order); the order within a unit is kept.
    ordered = sorted(groups.values(), key=expected, reverse=True)
    items[:] = [item for unit in ordered for item in unit]


GROUPING_LOST = pytest.StashKey[bool]()


def pytest_collection_finish(session):
    """pytest-xdist groups by a suffix it appends to each grouped test's id; with pytest 9.2 the suffix no longer
    takes (pytest-xdist#1386) and every group was silently spread over the workers (the scale-out cluster and the
    shared jobs were started once per worker). Fail the grouped tests rather than lose the grouping again."""
    if hasattr(session.config, "workerinput") and session.config.getoption("loadgroup", False):
        session.config.stash[GROUPING_LOST] = any(
            item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid.rsplit("]", 1)[-1]
            for item in session.items
        )


def pytest_runtest_setup(item):
    if item.config.stash.get(GROUPING_LOST, False) and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(
            f"pytest-xdist did not group this test with its file or the Spark session's tests (pytest "
            f"{pytest.__version__} and --dist loadgroup: pytest-xdist#1386; see requirements.lock)",
            pytrace=False,
        )
