"""What the demo echoes of the scheduler's output: the engines' noise goes, our lines and real errors stay.
The lines are as a scheduler printed them (`make run` before the noise was filtered)."""

from kafka_scheduler.cli.engine_noise import EngineNoiseFilter
from kafka_scheduler.kafka.client_log import KafkaClientLog

OUTPUT = """\
18:28:59 INFO  spark: starting (local[2], 2 shuffle partitions, wheel state layout, 4 shards)
WARNING: Using incubator modules: jdk.incubator.vector
18:29:18 INFO  running: reading kafka-scheduler-schedule-requests (native); stop with Ctrl-C or SIGTERM
Starting Streaming TransformWithStateInPandas Python worker.

Streaming TransformWithStateInPandas Python worker finish init stage of Python runner. Received UDF from JVM: <f>

18:30:01 INFO  batch 1: 1 requests (1 scheduled); 1 delivered (max lateness 35.31s) [state 6.95s, write 1.49s]
18:30:02 WARN TimerStateImpl: Failed to register timer for key=1 and time=2 ms since it already exists
18:30:03 WARN NativeCodeLoader: Unable to load native-hadoop library for your platform
18:31:19 INFO  received SIGTERM
18:31:19 ERROR Exception while sending command.
Traceback (most recent call last):
  File "py4j/clientserver.py", line 535, in send_command
py4j.protocol.Py4JNetworkError: Error while sending or receiving
18:31:19 ERROR KeyboardInterrupt while sending command.
Traceback (most recent call last):
KeyboardInterrupt
%3|1795717880.467|FAIL|rdkafka#producer-3| [thrd:127.0.0.1:19092/bootstrap]: Connect to ipv4#127.0.0.1:19092 failed
18:31:20 ERROR MicroBatchExecution: Query [id = 1] terminated with error
java.lang.IllegalStateException: the checkpoint is corrupt
\tat org.apache.spark.Foo.bar(Foo.scala:1)
18:31:20 ERROR query failed: the checkpoint is corrupt
18:31:21 WARNING the destination topic x does not exist
%3|1795717881.000|SSL|rdkafka#producer-1| [thrd:sasl_ssl://b:9093/bootstrap]: SSL handshake failed
Traceback (most recent call last):
ValueError: an uncaught failure
"""

SHOWN = """\
18:28:59 INFO  spark: starting (local[2], 2 shuffle partitions, wheel state layout, 4 shards)
18:29:18 INFO  running: reading kafka-scheduler-schedule-requests (native); stop with Ctrl-C or SIGTERM
18:30:01 INFO  batch 1: 1 requests (1 scheduled); 1 delivered (max lateness 35.31s) [state 6.95s, write 1.49s]
18:31:19 INFO  received SIGTERM
18:31:20 ERROR MicroBatchExecution: Query [id = 1] terminated with error
java.lang.IllegalStateException: the checkpoint is corrupt
\tat org.apache.spark.Foo.bar(Foo.scala:1)
18:31:20 ERROR query failed: the checkpoint is corrupt
18:31:21 WARNING the destination topic x does not exist
%3|1795717881.000|SSL|rdkafka#producer-1| [thrd:sasl_ssl://b:9093/bootstrap]: SSL handshake failed
Traceback (most recent call last):
ValueError: an uncaught failure
"""


def test_engine_noise_goes_and_our_lines_and_errors_stay():
    noise = EngineNoiseFilter()
    shown = [line for line in OUTPUT.splitlines(keepends=True) if noise.shows(line)]
    assert "".join(shown) == SHOWN


def test_debug_shows_everything():
    noise = EngineNoiseFilter(everything=True)
    assert all(noise.shows(line) for line in OUTPUT.splitlines())


def test_librdkafka_lines_go_to_debug(caplog):
    caplog.set_level("DEBUG", logger="kafka_scheduler.librdkafka")
    KafkaClientLog().log(3, "%s [%s] %s: %s", "FAIL", "rdkafka#producer-1", "thrd", "Connect failed")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("DEBUG", "FAIL [rdkafka#producer-1] thrd: Connect failed")
    ]


def test_a_line_nothing_is_known_of_shows_unless_it_continues_a_noisy_record():
    noise = EngineNoiseFilter()
    lines = {
        "Streaming TransformWithStateInPandas Python worker Completed execution of UDF: <f>.": False,
        "": False,  # the banner's blank line
        "/venv/pandas/core/frame.py:1: FutureWarning: something the worker's code does": True,  # not the banner's
        "18:30:02 WARN TaskSetManager: Lost task 0.0 in stage 1.0": False,
        "java.io.IOException: the warning's own exception": False,
        "\tat org.apache.spark.Foo.bar(Foo.scala:1)": False,
        'Exception in thread "main" java.lang.IllegalStateException: the JVM\'s last words': True,
        "WARNING: A terminally deprecated method in sun.misc.Unsafe has been called": False,
        "Terminating due to java.lang.OutOfMemoryError: Java heap space": True,
    }
    assert {line: noise.shows(line) for line in lines} == lines
