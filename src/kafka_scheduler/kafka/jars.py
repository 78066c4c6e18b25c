"""Where the JVM artifacts live.

Two bundles: ``spark-kafka`` (Spark's Kafka source and sink and spark-avro, which the job needs) and
``kafka-broker`` (the local broker of ``kafka-scheduler broker``, the demo and the tests). In a checkout both are
fetched once from Maven Central by scripts/setup.sh into ``.cache/jars/<bundle>``. A pip-installed server has no
checkout: the first ``run`` or ``submit`` downloads the spark-kafka jars, exactly the ones its pom names (shipped
in the package: ``spark-kafka.pom.xml``, the only list of them), into the user's cache; the broker jars come only
with a checkout (a pip-installed server is expected to use its own Kafka).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import urllib.error
import urllib.request
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import NamedTuple

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SPARK_KAFKA_POM = Path(__file__).with_name("spark-kafka.pom.xml")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
# The stamp scripts/setup.sh writes beside the jars it fetched: the first 16 hex digits of the pom's sha256.
STAMP = ".pom-sha"

log = logging.getLogger(__name__)


class MissingJars(RuntimeError):
    pass


class Artifact(NamedTuple):
    group: str
    name: str
    version: str

    def path(self) -> str:
        """Its jar's path in a Maven repository."""
        return f"{self.group.replace('.', '/')}/{self.name}/{self.version}/{self.file_name()}"

    def file_name(self) -> str:
        return f"{self.name}-{self.version}.jar"


def in_checkout() -> bool:
    """Whether this package runs from a checkout of the repository (src/ layout), not from an installed wheel."""
    return (PROJECT_ROOT / "scripts" / "setup.sh").is_file() and Path(__file__).resolve().parents[2].name == "src"


def java_binary() -> Path:
    """The java that runs the jars (the broker's, and Spark's launcher's): JAVA_HOME's, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    return Path(home) / "bin" / "java" if home else Path(shutil.which("java") or "java")


def cache_root() -> Path:
    """Where the command keeps what it fetches or builds: ``.cache`` of a checkout, else the user's cache."""
    if in_checkout():
        return PROJECT_ROOT / ".cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kafka-scheduler"


def cache_dir() -> Path:
    return Path(os.environ.get("KAFKA_SCHEDULER_JAR_CACHE") or cache_root() / "jars")


def artifacts(pom: Path = SPARK_KAFKA_POM) -> list[Artifact]:
    """The dependencies a pom names (groupId, artifactId, version), in its order."""
    namespace = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ElementTree.parse(pom).getroot()
    return [
        Artifact(
            *(
                dependency.findtext(f"m:{tag}", namespaces=namespace).strip()
                for tag in ("groupId", "artifactId", "version")
            )
        )
        for dependency in root.iterfind("m:dependencies/m:dependency", namespace)
    ]


def pom_stamp(pom: Path = SPARK_KAFKA_POM) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:16]


def _download(url: str) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise MissingJars(
            f"cannot download {url}: {reason}; set KAFKA_SCHEDULER_MAVEN_REPOSITORY to a Maven "
            f"mirror, or KAFKA_SCHEDULER_JAR_CACHE to a folder whose spark-kafka/ holds the jars "
            f"of {SPARK_KAFKA_POM.name}"
        ) from None


def fetch(folder: Path, pom: Path = SPARK_KAFKA_POM, repository: str | None = None) -> list[Path]:
    """Download the jars ``pom`` names (no transitive ones: PySpark ships the rest) into ``folder``, each checked
    against the repository's SHA-1 and written aside then renamed, so a reader never sees half a jar; then the
    stamp. Jars of an older pom in the folder are removed."""
    repository = (repository or os.environ.get("KAFKA_SCHEDULER_MAVEN_REPOSITORY") or MAVEN_CENTRAL).rstrip("/")
    wanted = artifacts(pom)
    folder.mkdir(parents=True, exist_ok=True)
    log.info("fetching Spark's Kafka connector (%d jars) from %s into %s, once", len(wanted), repository, folder)
    for artifact in wanted:
        url = f"{repository}/{artifact.path()}"
        data = _download(url)
        expected = _download(url + ".sha1").decode("ascii", "replace").split()[0].lower()
        if hashlib.sha1(data).hexdigest() != expected:
            raise MissingJars(f"{url}: the download does not match its SHA-1 ({expected}); try again")
        partial = folder / f".{artifact.file_name()}.{os.getpid()}"
        partial.write_bytes(data)
        os.replace(partial, folder / artifact.file_name())
    names = {artifact.file_name() for artifact in wanted}
    for old in folder.glob("*.jar"):
        if old.name not in names:
            old.unlink(missing_ok=True)
    (folder / STAMP).write_text(pom_stamp(pom) + "\n")
    return sorted(folder / name for name in names)


def jar_paths(bundle: str) -> list[Path]:
    """Jars of one bundle (``spark-kafka`` or ``kafka-broker``). The spark-kafka ones are downloaded when the
    folder has none, or has those fetched for another version of the pom (its stamp differs; jars put there by
    hand, without a stamp, are used as they are); the broker's come only from scripts/setup.sh."""
    folder = cache_dir() / bundle
    jars = sorted(folder.glob("*.jar"))
    if bundle == "spark-kafka":
        try:
            stale = (folder / STAMP).read_text().strip() != pom_stamp()
        except FileNotFoundError:
            stale = False
        return fetch(folder) if not jars or stale else jars
    if not jars:
        if in_checkout():
            raise MissingJars(
                f"no jars in {folder}; run `make setup` (or scripts/setup.sh) to fetch them from Maven Central"
            )
        raise MissingJars(
            f"no {bundle} jars in {folder}: the local broker comes with a checkout of the repository "
            f"(make setup); with a pip install, use your own Kafka (--bootstrap-servers)"
        )
    return jars
