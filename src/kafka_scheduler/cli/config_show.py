"""``kafka-scheduler config show``: the effective settings, where each came from, secrets masked.

The TOML form is a valid ``--config`` file (but for masked secrets) that sets what was set: each line says its
source in a comment, and defaults are written commented out (an explicit shards setting, for one, would have to
match the checkpoint's).
"""

from __future__ import annotations

import json
from typing import Any

from ..config import OPTIONS, Config, masked, source_kind


def _entries(config: Config) -> list[tuple[str, Any, str]]:
    """(key, value as the file writes it, source) of every setting; None for a value that is not set."""
    entries = []
    for option in OPTIONS:
        if option.name == "kafka_options":
            continue
        value = getattr(config, option.name)
        source = config.given_by(option.name)
        entries.append((option.name, None if value is None else option.show(value), _source_text(source)))
    return entries


def _kafka_entries(config: Config) -> list[tuple[str, str, str]]:
    return [
        (key, value, _source_text(config.given_by(f"kafka.{key}")))
        for key, value in masked(config.kafka_options).items()
    ]


def _source_text(source) -> str:
    kind = source_kind(source)
    if kind == "file":
        return "file " + source.partition(" in ")[2]
    return kind if kind == "default" else f"{kind} {source}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)  # then a JSON string is a TOML basic string


def _toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)  # quoted: a bare dotted key would be a nested table


def as_toml(config: Config) -> str:
    lines = []
    for key, value, source in _entries(config):
        line = f"{key} is not set" if value is None else f"{key} = {_toml_value(value)}"
        lines.append(f"# {line}  # default" if source == "default" else f"{line}  # {source}")
    lines.append("")
    lines.append("[kafka]")
    kafka = _kafka_entries(config)
    lines += [f"{_toml_key(key)} = {_toml_value(value)}  # {source}" for key, value, source in kafka]
    if not kafka:
        lines.append("# no Kafka client options")
    return "\n".join(lines) + "\n"


def as_json(config: Config) -> str:
    settings = {key: value for key, value, _ in _entries(config)}
    settings["kafka"] = {key: value for key, value, _ in _kafka_entries(config)}
    sources = {key: source for key, _, source in _entries(config)}
    sources.update({f"kafka.{key}": source for key, _, source in _kafka_entries(config)})
    return json.dumps({"settings": settings, "sources": sources}, indent=2) + "\n"
