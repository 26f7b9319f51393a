"""What a waiting sensor concludes from a gang and its ``status.json``: running, done, failed, stalled.

Shared by the Airflow trigger (which re-creates it after every deferral, so the progress clock
travels in ``Watch.as_dict``) and by anything else that waits on a gang. Progress is a change of
the trainer's (state, step) as written in ``status.json`` by this attempt (a file left by an
earlier attempt does not count). Stalled means no progress for ``stall_timeout_s`` — a node
stopped with SIGSTOP or a hung collective freezes every rank's step counter — or, before this
attempt showed any progress, for ``startup_timeout_s``. While the trainer says it is starting up
or writing a checkpoint, steps legitimately pause, so there a fresh heartbeat also counts.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.launch import local
from pipelines.run_folder import DONE, RunFolder, State

STALLED, TIMED_OUT, SUPERSEDED = "stalled", "timed_out", "superseded"
_BUSY_WITHOUT_STEPS = (State.INITIALIZING, State.CHECKPOINTING)


def _epoch(iso: str | None) -> float:
    return datetime.fromisoformat(iso).timestamp() if iso else 0.0


@dataclass
class Watch:
    """Progress clock of one gang attempt: the last (state, step) seen and when it last moved."""

    gang_json: str
    gang_id: str                     # the attempt this watch belongs to (gang.json is rewritten per attempt)
    stall_timeout_s: float
    startup_timeout_s: float
    deadline: float                  # epoch seconds: compute.timeout_s after the gang started
    seen: str = ""                   # "<state>@<step>" last seen from this attempt
    moved_at: float = 0.0            # epoch seconds

    def check(self, now: float | None = None) -> dict[str, Any]:
        """One look: ``{"state", "detail", "status", ...}``; ``state`` is running/succeeded/failed/stalled/timed_out,
        or superseded once ``gang.json`` holds a newer gang than this watch's."""
        now = time.time() if now is None else now
        handle = local.Handle.load(Path(self.gang_json))
        if handle.gang_id != self.gang_id:  # a later launch rewrote gang.json: never watch (or stop) it as ours
            return {"state": SUPERSEDED, "detail": f"gang {self.gang_id} was replaced by gang {handle.gang_id}",
                    "status": {}, "attempt": handle.attempt, "watch": self.as_dict()}
        gang = local.poll(handle)
        started = _epoch(handle.started_at)
        status = RunFolder.of_gang(handle.path).read_status()
        heartbeat = _epoch(status.get("heartbeat_at"))
        fresh = heartbeat >= started
        if not self.moved_at:
            self.moved_at = started
        if fresh and (key := f"{status.get('state')}@{status.get('step')}") != self.seen:
            self.seen, self.moved_at = key, now
        last_sign = self.moved_at
        if fresh and status.get("state") in _BUSY_WITHOUT_STEPS:
            last_sign = max(last_sign, heartbeat)
        out = {"state": gang.state, "detail": gang.detail, "status": status if fresh else {},
               "attempt": handle.attempt, "watch": self.as_dict()}
        if gang.state != local.RUNNING:
            return out
        if now > self.deadline:
            return {**out, "state": TIMED_OUT, "detail": "training gang exceeded compute.timeout_s"}
        # Before this attempt's first sign, and once the trainer says it is done and only has to
        # exit, the longer startup budget applies; in between, the stall budget.
        steady = self.seen and status.get("state") not in DONE
        limit, what = ((self.stall_timeout_s, "compute.stall_timeout_s") if steady else
                       (self.startup_timeout_s, "compute.startup_timeout_s"))
        if now - last_sign > limit:
            return {**out, "state": STALLED,
                    "detail": f"no heartbeat and no step progress for {now - last_sign:.0f} s ({what}={limit:g}); "
                              f"last seen {self.seen or 'nothing from this attempt'}"}
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
