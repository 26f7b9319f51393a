"""``status.json`` (rewritten atomically) and ``metrics.jsonl`` (appended), rank 0 only.

The orchestrator's sensors read these files; the trainer never talks to a tracking server.
``status.json`` is rewritten at every state change and otherwise at most every ``every_s``
seconds; ``heartbeat_at`` is the time of the last rewrite.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainer.fsio import utc_now, write_json_atomic

STATES = ("pending", "initializing", "running", "checkpointing", "succeeded", "failed",
          "canceling", "canceled")


class StatusWriter:
    def __init__(self, run_dir: Path, total_steps: int, enabled: bool, every_s: float = 5.0) -> None:
        self.path = run_dir / "status.json"
        self.metrics = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.every_s = every_s
        self._last = 0.0
        self.fields: dict[str, Any] = {
            "state": "pending", "step": 0, "total_steps": total_steps, "tokens_seen": 0,
            "loss": None, "tokens_per_s": None, "mfu": None, "heartbeat_at": None,
            "last_checkpoint": None, "restarts": 0, "error": None,
            # beyond DESIGN's fields: health at a glance
            "slow_ranks": [], "skipped_steps": 0,
        }
        if enabled and self.path.exists():
            previous = json.loads(self.path.read_text())
            self.fields["restarts"] = int(previous.get("restarts", 0)) + (
                previous.get("state") not in (None, "pending"))

    def update(self, force: bool = False, **fields: Any) -> None:
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"unknown state {fields['state']!r}")
        self.fields.update(fields)
        now = time.monotonic()
        if self.enabled and (force or "state" in fields or now - self._last >= self.every_s):
            self.fields["heartbeat_at"] = utc_now()
            write_json_atomic(self.path, self.fields, durable=False)
            self._last = now

    def log_metrics(self, record: dict[str, Any]) -> None:
        if self.enabled:
            with open(self.metrics, "a") as fh:
                fh.write(json.dumps({"time": utc_now(), **record}) + "\n")


def record_failure(run_dir: Path, error: str) -> None:
    """Any rank, about to die without rank 0's help (watchdog): mark the run failed with ``error``."""
    path = run_dir / "status.json"
    try:
        fields = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        fields = {}
    write_json_atomic(path, {**fields, "state": "failed", "error": error, "heartbeat_at": utc_now()})
