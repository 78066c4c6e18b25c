"""engine/rules/ is free of Spark: every module of it imports in a fresh interpreter without pyspark being imported
(the rules run and are tested without a JVM; a Spark type a rule needs is DDL text, engine/rules/fields.py)."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

from kafka_scheduler.engine import rules

SRC = Path(rules.__file__).resolve().parents[3]


def test_every_rules_module_imports_without_pyspark():
    modules = sorted(f"{rules.__name__}.{m.name}" for m in pkgutil.iter_modules(rules.__path__))
    assert len(modules) > 10, modules
    script = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m == 'pyspark' or m.startswith('pyspark.')))\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert result.stdout.strip() == "[]", result.stdout
