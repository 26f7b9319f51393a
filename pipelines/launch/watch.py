"""What a waiting sensor concludes from a gang and its ``status.json``: running, done, failed, stalled.

Shared by the Airflow trigger (which re-creates it after every deferral, so the progress clock
travels in ``Watch.as_dict``) and by anything else that waits on a gang. Stalled means no step
progress for ``stall_timeout_s`` — a node stopped with SIGSTOP or a hung collective freezes every
rank's step counter. While the trainer says it is starting up or writing a checkpoint, steps
legitimately pause, so there a fresh heartbeat also counts as a sign of life.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.launch import local

STALLED, TIMED_OUT = "stalled", "timed_out"
_BUSY_WITHOUT_STEPS = ("initializing", "checkpointing")


def read_status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _epoch(iso: str | None) -> float:
    return datetime.fromisoformat(iso).timestamp() if iso else 0.0


@dataclass
class Watch:
    """Progress clock of one gang: the last step seen and when it (or a heartbeat) last moved."""

    gang_json: str
    stall_timeout_s: float
    deadline: float                  # epoch seconds: compute.timeout_s after the gang started
    step: int = -1
    moved_at: float = 0.0            # epoch seconds

    def check(self, now: float | None = None) -> dict[str, Any]:
        """One look: ``{"state", "detail", "status", ...}``; ``state`` is running/succeeded/failed/stalled/timed_out."""
        now = time.time() if now is None else now
        handle = local.Handle.load(Path(self.gang_json))
        gang = local.poll(handle)
        status = read_status(handle.path.parent.parent)
        if not self.moved_at:
            self.moved_at = _epoch(handle.started_at)
        step = int(status.get("step") or 0)
        if step != self.step:
            self.step, self.moved_at = step, now
        last_sign = self.moved_at
        if status.get("state") in _BUSY_WITHOUT_STEPS:  # a heartbeat vouches for these phases only
            heartbeat = _epoch(status.get("heartbeat_at"))
            if heartbeat >= _epoch(handle.started_at):   # not one left by an earlier attempt
                last_sign = max(last_sign, heartbeat)
        out = {"state": gang.state, "detail": gang.detail, "status": status, "attempt": handle.attempt,
               "watch": self.as_dict()}
        if gang.state != local.RUNNING:
            return out
        if now > self.deadline:
            return {**out, "state": TIMED_OUT, "detail": "training gang exceeded compute.timeout_s"}
        if now - last_sign > self.stall_timeout_s:
            return {**out, "state": STALLED,
                    "detail": f"no heartbeat and no step progress for {now - last_sign:.0f} s "
                              f"(compute.stall_timeout_s={self.stall_timeout_s:g}); last step {step}"}
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
