"""Structured events: one JSON object per line, UTC ISO 8601 time, on every rank's log.

Rank 0 also appends them to the run's ``events.jsonl`` so the orchestrator (and a person) can read
what happened without parsing logs: startup checks, resumes, checkpoints, skipped steps, loss
spikes, slow ranks, failures.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from trainer.fsio import utc_now

log = logging.getLogger("trainer.events")


class Events:
    def __init__(self, path: Path, rank: int, to_file: bool) -> None:
        self.rank = rank
        self.path = path if to_file else None

    def emit(self, event: str, level: int = logging.INFO, write: bool = True, **fields: Any) -> dict[str, Any]:
        """Log the event; rank 0 also appends it to ``events.jsonl`` unless ``write`` is false."""
        record = {"time": utc_now(), "event": event, "rank": self.rank,
                  "level": logging.getLevelName(level).lower(), **fields}
        line = json.dumps(record, default=str)
        log.log(level, line)
        if write and self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(line + "\n")
        return record
