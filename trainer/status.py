"""``status.json`` (rewritten atomically) and ``metrics.jsonl`` (appended), rank 0 only.

The orchestrator's sensors read these files; the trainer never talks to a tracking server.
``status.json`` is rewritten at every state change and otherwise at most every ``every_s``
seconds; ``heartbeat_at`` is the time of the last rewrite.
"""

from __future__ import annotations

import json
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from trainer.fsio import utc_now, write_json
from trainer.paths import TrainerPaths


class State(StrEnum):
    """``status.json``'s ``state``: the trainer's lifecycle, as every reader of the file names it."""

    PENDING = "pending"
    INITIALIZING = "initializing"
    RUNNING = "running"
    CHECKPOINTING = "checkpointing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELING = "canceling"
    CANCELED = "canceled"


DONE = (State.SUCCEEDED, State.FAILED, State.CANCELED)  # the trainer will write nothing more


class StatusWriter:
    def __init__(self, paths: TrainerPaths, total_steps: int, enabled: bool, every_s: float = 5.0) -> None:
        self.path = paths.status
        self.metrics = paths.metrics
        self.enabled = enabled
        self.every_s = every_s
        self._last = 0.0
        self.fields: dict[str, Any] = {
            "state": State.PENDING, "step": 0, "total_steps": total_steps, "tokens_seen": 0,
            "loss": None, "tokens_per_s": None, "mfu": None, "heartbeat_at": None,
            "last_checkpoint": None, "restarts": 0, "error": None,
            # beyond the status contract (docs/architecture.md): health at a glance
            "slow_ranks": [], "skipped_steps": 0,
        }
        if enabled and self.path.exists():
            previous = json.loads(self.path.read_text())
            self.fields["restarts"] = int(previous.get("restarts", 0)) + (
                previous.get("state") not in (None, State.PENDING))

    def update(self, force: bool = False, **fields: Any) -> None:
        if "state" in fields and fields["state"] not in State.__members__.values():
            raise ValueError(f"unknown state {fields['state']!r}")
        self.fields.update(fields)
        now = time.monotonic()
        if self.enabled and (force or "state" in fields or now - self._last >= self.every_s):
            self.fields["heartbeat_at"] = utc_now()
            write_json(self.path, self.fields, durable=False)
            self._last = now

    def log_metrics(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.metrics, "a") as fh:
                fh.write(json.dumps({"time": utc_now(), **record}) + "\n")


def record_failure(path: Path, error: str) -> None:
    """Any rank, about to die without rank 0's help (watchdog): mark the run failed with ``error``
    in the status file at ``path``."""
    try:
        fields = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        fields = {}
    write_json(path, {**fields, "state": State.FAILED, "error": error, "heartbeat_at": utc_now()})
