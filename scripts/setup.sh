#!/usr/bin/env bash
# Installs what is missing, once: the virtualenv (.venv) with the pinned Python packages,
# and the JVM jars (Spark's Kafka connector, the Kafka broker) from Maven Central into
# .cache/jars. A second run only checks stamps and takes about a second.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'setup: %s\n' "$*"; }

need_root_apt() {
    say "installing Debian packages: $*"
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq "$@" >/dev/null
    else sudo apt-get update -qq && sudo apt-get install -y -qq "$@" >/dev/null; fi
}

# --- Java 17+ and Maven (the JVM pieces come from Maven Central through mvn)
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ]; then need_root_apt openjdk-17-jre-headless; fi
command -v mvn >/dev/null || need_root_apt maven

# --- Python virtualenv
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ is needed"'
    say "creating .venv"
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    say "installing Python packages (pinned in requirements.lock)"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -r requirements.lock
    .venv/bin/python -m pip install -q --no-deps -e .
    rm -f .venv/.installed-*
    touch "$stamp"
fi

# --- JVM jars, one folder per bundle, refreshed when its pom changes
fetch_jars() {  # bundle, its pom, extra maven flags
    local bundle=$1 pom=$2; shift 2
    local dest=".cache/jars/$bundle"
    local want; want=$(sha256sum "$pom" | cut -c1-16)
    if [ "$(cat "$dest/.pom-sha" 2>/dev/null)" != "$want" ]; then
        say "fetching $bundle jars from Maven Central"
        rm -rf "$dest"
        mkdir -p .cache
        if ! mvn -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$PWD/$dest" "$@" \
                > ".cache/mvn-$bundle.log" 2>&1; then
            cat ".cache/mvn-$bundle.log"
            exit 1
        fi
        echo "$want" > "$dest/.pom-sha"
    fi
}
# The connector's pom is package data: a pip-installed server downloads the same jars (kafka/jars.py).
fetch_jars spark-kafka src/kafka_scheduler/kafka/spark-kafka.pom.xml -DexcludeTransitive=true
fetch_jars kafka-broker jvm/kafka-broker.pom.xml -DincludeScope=runtime
say "ready"
