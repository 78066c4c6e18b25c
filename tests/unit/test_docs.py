"""The docs against the code: the option table names every option, the README stays short and starts with the
two make commands, and every relative link in README.md and docs/*.md points to a file that exists."""

import argparse
import re
from pathlib import Path

import pytest

from kafka_scheduler.config import OPTIONS, add_arguments, env_name, kafka_settings, resolve, spark_kafka_options
from kafka_scheduler.ops.metrics import SchedulerMetrics

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_the_configuration_page_documents_every_option():
    missing = [o.name for o in OPTIONS if f"`{o.flag}`" not in CONFIGURATION or f"`{env_name(o)}`" not in CONFIGURATION]
    assert missing == []


def test_the_configuration_page_example_file_is_valid(tmp_path):
    example = CONFIGURATION.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "reminders.toml"
    path.write_text(example)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = resolve(parser.parse_args(["--config", str(path)]), environ={})
    assert config.app_id == "reminders" and config.exactly_once
    assert kafka_settings(config)["sasl.username"] == "scheduler"
    assert spark_kafka_options(config)["kafka.ssl.truststore.type"] == "PEM"


def test_the_operations_page_lists_every_metric():
    table = OPERATIONS.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    names = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in SchedulerMetrics({}).registry.collect()
    }
    listed = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `kafka_scheduler_")}
    assert listed == names


def test_readme_quick_start_is_the_two_make_commands():
    quick_start = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.split("```sh", 1)[1].split("```", 1)[0].splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]


def test_readme_fits_on_a_few_screens():
    assert len(README.splitlines()) <= 250


def relative_links(text: str) -> list[str]:
    """Targets of the Markdown links and images of a page, outside code, without their #anchor."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    targets = [m.group(1) for m in LINK.finditer(prose)]
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_a_file_that_exists(page):
    links = relative_links(page.read_text())
    broken = [link for link in links if not (page.parent / link).exists()]
    assert broken == []


def test_the_link_check_sees_links_and_skips_code_and_urls():
    text = "see [a](docs/a.md#x) and ![b](b.svg), [c](https://x.org/c), [d](#top), `[e](e.md)`\n```\n[f](f.md)\n```\n"
    assert relative_links(text) == ["docs/a.md", "b.svg"]
