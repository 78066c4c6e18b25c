"""`make run` runs `kafka-scheduler demo`: it must start its own broker when none answers, start the scheduler,
show the scheduled message arriving, then show each delivery to the demo topic as it arrives (one sent with the CLI
the demo suggests included), and say nothing of the engines underneath (Spark's JVM and Python workers, librdkafka,
py4j). Ctrl-C stops everything."""

import os
import re
import signal
import subprocess
import sys
import urllib.request

from kafka_scheduler.kafka.local_broker import free_port, port_open

from .support import wait_until

# What the engines print for themselves; none of it belongs in the demo's output.
ENGINE_NOISE = (
    "WARN",
    "%3|",
    "%4|",
    "%5|",
    "%6|",
    "%7|",
    "rdkafka",
    "py4j",
    "NativeCodeLoader",
    "Python worker",
    "log4j",
    "Traceback",
)


def test_demo_shows_deliveries_as_they_arrive_and_no_engine_noise(tmp_path):
    port = free_port()
    output_file = tmp_path / "demo.out"
    env = {name: value for name, value in os.environ.items() if name != "KAFKA_SCHEDULER_LOG_LEVEL"}
    env["KAFKA_SCHEDULER_METRICS_PORT"] = str(free_port())  # as `make run` has it (9464 by default): a status page
    with open(output_file, "w") as output:
        # Its own process group, like a terminal's foreground job: the Ctrl-C below reaches everything in it.
        demo = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kafka_scheduler",
                "demo",
                "--delay",
                "3",
                "--bootstrap-servers",
                f"127.0.0.1:{port}",
                "--data-dir",
                str(tmp_path / "broker"),
                "--checkpoint-dir",
                str(tmp_path / "checkpoint"),
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=tmp_path,
            env=env,
            start_new_session=True,
        )

    def text() -> str:
        return output_file.read_text()

    def running() -> None:
        assert demo.poll() is None, f"the demo exited with code {demo.returncode}:\n{text()[-3000:]}"

    try:
        wait_until(lambda: "the scheduler keeps running" in text(), 420, "the demo message to arrive", guard=running)
        assert "starting a local one" in text()
        page = f"http://127.0.0.1:{env['KAFKA_SCHEDULER_METRICS_PORT']}/"
        assert f"The status page (pending schedules, upcoming deliveries, health, look-up by id): {page}" in text()
        with urllib.request.urlopen(page, timeout=30) as response:
            assert response.status == 200 and b"<canvas" in response.read()
        assert re.search(
            r"delivered id=demo-(\w+) key='demo-\1' to demo-deliveries at \S+Z "
            r"\(due \S+Z, \d+\.\d\ds late\): 'hello from kafka-scheduler \(\1\)'",
            text(),
        ), text()

        sent = subprocess.run(
            [
                sys.executable,
                "-m",
                "kafka_scheduler",
                "schedule",
                "--bootstrap-servers",
                f"127.0.0.1:{port}",
                "--to",
                "demo-deliveries",
                "--at",
                "+1s",
                "--key",
                "user-42",
                "--value",
                "hello",
                "--id",
                "reminder-42",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
            env=env,
        )
        assert sent.returncode == 0, sent.stderr
        wait_until(
            lambda: re.search(
                r"delivered id=reminder-42 key='user-42' to demo-deliveries at \S+Z "
                r"\(due \S+Z, \d+\.\d\ds late\): 'hello'",
                text(),
            ),
            180,
            "the CLI's schedule to be printed as it arrives",
            guard=running,
        )

        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C
        assert demo.wait(240) == 0, text()[-3000:]
    finally:
        if demo.poll() is None:  # a failure above: the demo still stops its scheduler and broker on SIGTERM
            demo.terminate()
            try:
                demo.wait(240)
            except subprocess.TimeoutExpired:
                demo.kill()
    assert not port_open("127.0.0.1", port), "the demo's broker is still running"
    noisy = [line for line in text().splitlines() if any(noise in line for noise in ENGINE_NOISE)]
    assert not noisy, "engine noise in the demo's output:\n" + "\n".join(noisy[:20])
