"""The README's configuration table must name every option, with its flag and variable."""

from pathlib import Path

from kafka_scheduler.config import OPTIONS, env_name

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_documents_every_option():
    missing = [o.name for o in OPTIONS
               if f"`{o.flag}`" not in README or f"`{env_name(o)}`" not in README]
    assert missing == []


def test_readme_quick_start_is_the_two_make_commands():
    quick_start = README.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick_start.split("```sh", 1)[1].split("```", 1)[0].splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]
