"""`make run` runs `kafka-scheduler demo`: it must start its own broker when none answers,
start the scheduler, and show the scheduled message arriving."""

import subprocess
import sys

from kafka_scheduler.broker import free_port, port_open


def test_demo_starts_a_broker_and_shows_a_message_arriving(tmp_path):
    port = free_port()
    result = subprocess.run(
        [sys.executable, "-m", "kafka_scheduler", "demo", "--once", "--delay", "3",
         "--bootstrap-servers", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "broker"),
         "--checkpoint-dir", str(tmp_path / "checkpoint")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "starting a local one" in output
    assert "ARRIVED on demo-deliveries" in output
    assert not port_open("127.0.0.1", port), "the demo's broker is still running"
