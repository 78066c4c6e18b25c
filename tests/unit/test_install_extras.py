"""Two installs: `pip install kafka-scheduler` (the client and the request commands: confluent-kafka and croniter) and
`pip install "kafka-scheduler[server]"` (the job). Here without building anything: the server's modules are hidden
from a child Python, which must still send requests and must name the missing extra for the job's commands; and
the Spark connector jars a pip-installed server downloads, from a fake Maven repository.
(The real wheel in a new virtualenv: tests/integration/test_client_install.py.)"""

from __future__ import annotations

import hashlib
import http.server
import re
import subprocess
import sys
import textwrap
import threading
import tomllib
from pathlib import Path

import pytest

from kafka_scheduler.cli.main import CHECKOUT_COMMANDS, SERVER_COMMANDS, SERVER_MODULES, missing_server_packages
from kafka_scheduler.kafka import jars

ROOT = Path(__file__).resolve().parents[2]
# What a client-only install lacks: the [server] extra's modules, fastavro (the [avro] extra) and what they bring.
HIDDEN = (*SERVER_MODULES, "fastavro", "py4j", "numpy")

# A child Python in which the hidden modules cannot be imported, as if not installed.
HIDE = textwrap.dedent(f"""\
    import sys

    HIDDEN = {HIDDEN!r}

    class NotInstalled:
        def find_spec(self, name, path=None, target=None):
            if any(name == hidden or name.startswith(hidden + ".") for hidden in HIDDEN):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from kafka_scheduler.cli.main import main
    """)


def without_server(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", HIDE + textwrap.dedent(code)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower() for requirement in requirements}


def test_the_server_check_follows_the_server_extra():
    """The modules the commands check are those of the [server] extra (besides fastavro, the [avro] one), and all
    of them are installed here: a full install is never told it lacks something."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert requirement_names(extras["server"]) == set(SERVER_MODULES.values()) | requirement_names(extras["avro"])
    assert missing_server_packages() == []


@pytest.mark.parametrize("command", [name for name in SERVER_COMMANDS if name not in CHECKOUT_COMMANDS])
def test_a_server_command_without_the_server_names_the_extra(command):
    result = without_server(f"""\
        raise SystemExit(main([{command!r}]))
        """)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr == (
        f"kafka-scheduler {command}: error: needs the server install (pyspark, pandas, pyarrow, "
        f'protobuf, prometheus-client missing): pip install "kafka-scheduler[server]"\n'
    )


def test_one_missing_module_is_named_alone():
    code = HIDE.replace(f"HIDDEN = {HIDDEN!r}", "HIDDEN = ('prometheus_client',)") + "raise SystemExit(main(['run']))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert "(prometheus-client missing)" in result.stderr, result.stderr


def test_the_client_and_the_request_commands_work_without_the_server():
    result = without_server("""\
        import contextlib, io

        from kafka_scheduler.client import DIALECTS, RequestError, SchedulerClient, encode, format_instant, parse_due
        import kafka_scheduler.client.encoders

        def cli(*argv):
            out, err = io.StringIO(), io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(list(argv))
                except SystemExit as exc:
                    code = exc.code
            return code, out.getvalue(), err.getvalue()

        assert cli("--version")[0] == 0
        for argv in (["--help"], ["schedule", "--help"], ["replace", "--help"], ["cancel", "--help"]):
            assert cli(*argv)[0] == 0, argv
        code, out, err = cli("config", "show", "--app-id", "billing")
        assert code == 0 and 'app_id = "billing"' in out, (code, out, err)

        # Every dialect encodes; sky-avro needs fastavro, except for a cancel (a null value).
        for dialect in DIALECTS:
            if dialect != "sky-avro":
                encode(dialect, "ADD", request_id="r", topic="out", due=parse_due("+1m"), value=b"v")
            encode(dialect, "CANCEL", request_id="r")
        try:
            encode("sky-avro", "ADD", request_id="r", topic="out", due=parse_due("+1m"), value=b"v")
        except RequestError as error:
            assert str(error) == ('the sky-avro dialect needs fastavro, which is not installed: '
                                  'pip install "kafka-scheduler[avro]"'), error
        else:
            raise AssertionError("sky-avro encoded without fastavro")
        code, out, err = cli("schedule", "--dialect", "sky-avro", "--requests-topic", "s", "--id", "r", "--to", "out",
                             "--at", "+1m", "--bootstrap-servers", "127.0.0.1:1")
        assert (code, out) == (2, "") and err.count("\\n") == 1 and "kafka-scheduler[avro]" in err, (code, err)

        # A cron is checked with the job's rules (croniter; numpy, the job's, is not needed for it).
        code, out, err = cli("schedule", "--to", "out", "--cron", "* * * * * *", "--id", "c",
                             "--bootstrap-servers", "127.0.0.1:1")
        assert (code, out) == (2, "") and "more often than the minimum interval 5s" in err, (code, err)

        with SchedulerClient("127.0.0.1:1", app_id="billing") as client:  # connects only to send
            assert client.requests_topic == "billing-schedule-requests"

        loaded = sorted({name.split(".")[0] for name in sys.modules} & {h.split(".")[0] for h in HIDDEN})
        assert loaded == [], loaded
        print("ok")
        """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# ---------------------------------------------------------------- the connector jars of a pip-installed server


def test_the_pom_names_the_jars_setup_fetched():
    """The pom shipped in the package is the one scripts/setup.sh fetches the checkout's jars with."""
    assert "src/kafka_scheduler/kafka/spark-kafka.pom.xml" in (ROOT / "scripts" / "setup.sh").read_text()
    assert {artifact.file_name() for artifact in jars.artifacts()} == {
        path.name for path in jars.jar_paths("spark-kafka")
    }


POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <dependencies>
    <dependency><groupId>org.example</groupId><artifactId>first_2.13</artifactId><version>1.2.0</version></dependency>
    <dependency><groupId>org.example.more</groupId><artifactId>second</artifactId><version>3.0</version></dependency>
  </dependencies>
</project>
"""


@pytest.fixture
def maven(tmp_path):
    """A Maven repository served over HTTP on loopback, with the two jars of POM and their SHA-1 files."""
    root = tmp_path / "repository"
    for path, data in (
        ("org/example/first_2.13/1.2.0/first_2.13-1.2.0.jar", b"first jar"),
        ("org/example/more/second/3.0/second-3.0.jar", b"second jar"),
    ):
        (root / path).parent.mkdir(parents=True)
        (root / path).write_bytes(data)
        (root / (path + ".sha1")).write_text(hashlib.sha1(data).hexdigest() + "  " + Path(path).name + "\n")

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    pom = tmp_path / "test.pom.xml"
    pom.write_text(POM)
    yield root, f"http://127.0.0.1:{server.server_address[1]}/", pom
    server.shutdown()
    server.server_close()


def test_fetch_downloads_the_jars_the_pom_names(maven, tmp_path):
    _root, url, pom = maven
    folder = tmp_path / "jars" / "spark-kafka"
    (folder).mkdir(parents=True)
    (folder / "first_2.13-1.1.0.jar").write_bytes(b"an older version")
    fetched = jars.fetch(folder, pom, repository=url)
    assert [p.name for p in fetched] == ["first_2.13-1.2.0.jar", "second-3.0.jar"]
    assert sorted(p.name for p in folder.iterdir()) == [".pom-sha", "first_2.13-1.2.0.jar", "second-3.0.jar"]
    assert (folder / "second-3.0.jar").read_bytes() == b"second jar"
    assert (folder / ".pom-sha").read_text() == jars.pom_stamp(pom) + "\n"


def test_fetch_refuses_a_jar_that_does_not_match_its_checksum(maven, tmp_path):
    root, url, pom = maven
    (root / "org/example/more/second/3.0/second-3.0.jar").write_bytes(b"tampered")
    folder = tmp_path / "jars"
    with pytest.raises(jars.MissingJars, match=r"second-3.0.jar: the download does not match its SHA-1"):
        jars.fetch(folder, pom, repository=url)
    assert not (folder / "second-3.0.jar").exists() and not (folder / ".pom-sha").exists()


def test_fetch_names_the_url_it_could_not_download(maven, tmp_path):
    root, url, pom = maven
    (root / "org/example/first_2.13/1.2.0/first_2.13-1.2.0.jar").unlink()
    with pytest.raises(jars.MissingJars) as error:
        jars.fetch(tmp_path / "jars", pom, repository=url)
    assert str(error.value).startswith(f"cannot download {url}org/example/first_2.13/1.2.0/first_2.13-1.2.0.jar: ")
    assert "KAFKA_SCHEDULER_MAVEN_REPOSITORY" in str(error.value) and "\n" not in str(error.value)


def test_outside_a_checkout_jars_go_to_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.setattr(jars, "in_checkout", lambda: False)
    monkeypatch.delenv("KAFKA_SCHEDULER_JAR_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.cache_dir() == tmp_path / "kafka-scheduler" / "jars"
    fetched = []
    monkeypatch.setattr(jars, "fetch", lambda folder: fetched.append(folder) or [folder / "x.jar"])
    assert jars.jar_paths("spark-kafka") == [tmp_path / "kafka-scheduler" / "jars" / "spark-kafka" / "x.jar"]
    with pytest.raises(
        jars.MissingJars,
        match=r"the local broker comes with a checkout of the repository \(make "
        r"setup\); with a pip install, use your own Kafka",
    ):
        jars.jar_paths("kafka-broker")


def test_jars_are_fetched_again_only_for_another_pom(monkeypatch, tmp_path):
    monkeypatch.setenv("KAFKA_SCHEDULER_JAR_CACHE", str(tmp_path))
    folder = tmp_path / "spark-kafka"
    folder.mkdir()
    fetched = []
    monkeypatch.setattr(jars, "fetch", lambda where: fetched.append(where) or [])
    (folder / "by-hand.jar").write_bytes(b"")  # no stamp: put there by hand, used as it is
    assert jars.jar_paths("spark-kafka") == [folder / "by-hand.jar"] and fetched == []
    (folder / ".pom-sha").write_text(jars.pom_stamp() + "\n")
    assert jars.jar_paths("spark-kafka") == [folder / "by-hand.jar"] and fetched == []
    (folder / ".pom-sha").write_text("0123456789abcdef\n")  # fetched for another version of the package
    jars.jar_paths("spark-kafka")
    assert fetched == [folder]
