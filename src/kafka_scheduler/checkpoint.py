"""Reading a query checkpoint from outside the query: progress and committed request offsets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def last_committed_batch(checkpoint_dir: str | Path) -> Optional[int]:
    commits = Path(checkpoint_dir) / "commits"
    ids = [int(p.name) for p in commits.glob("[0-9]*") if p.name.isdigit()] if commits.is_dir() else []
    return max(ids) if ids else None


def committed_offsets(checkpoint_dir: str | Path) -> dict[str, dict[int, int]]:
    """Next offset to read per topic and partition, as of the last committed batch ({} before the first)."""
    batch = last_committed_batch(checkpoint_dir)
    if batch is None:
        return {}
    lines = (Path(checkpoint_dir) / "offsets" / str(batch)).read_text().splitlines()
    offsets: dict[str, dict[int, int]] = {}
    for line in lines[2:]:  # "v1", batch metadata, then one JSON line per source
        if line.startswith("{"):
            for topic, partitions in json.loads(line).items():
                offsets.setdefault(topic, {}).update({int(p): int(o) for p, o in partitions.items()})
    return offsets
