"""What a waiting sensor concludes from a gang and its ``status.json``: running, done, failed, stalled.

One clock (``look``) for both launchers: ``Watch`` for a local gang (its processes and ``gang.json``),
``StatusWatch`` for a gang that something else runs and reports on (a Kubernetes Job, whose own
status says only running or ended); each travels as a trigger's argument (``as_dict``). Progress is a change of
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


def look(clock: Any, status: dict[str, Any], started: float, now: float) -> tuple[bool, str | None]:
    """Advance ``clock`` (a ``Watch`` or a ``StatusWatch``: its ``seen``, ``moved_at`` and budgets) by one
    look at ``status``; returns (the status is this attempt's, why it is stalled or None)."""
    heartbeat = _epoch(status.get("heartbeat_at"))
    fresh = heartbeat >= started
    if not clock.moved_at:
        clock.moved_at = started
    if fresh and (key := f"{status.get('state')}@{status.get('step')}") != clock.seen:
        clock.seen, clock.moved_at = key, now
    last_sign = clock.moved_at
    if fresh and status.get("state") in _BUSY_WITHOUT_STEPS:
        last_sign = max(last_sign, heartbeat)
    # Before this attempt's first step (no sign yet, or starting up: rendezvous with the slowest
    # node, loading the checkpoint), and once the trainer says it is done and only has to exit,
    # the longer startup budget applies; in between, the stall budget.
    steady = clock.seen and status.get("state") not in (*DONE, State.INITIALIZING)
    limit, what = ((clock.stall_timeout_s, "compute.stall_timeout_s") if steady else
                   (clock.startup_timeout_s, "compute.startup_timeout_s"))
    if now - last_sign > limit:
        return fresh, (f"no heartbeat and no step progress for {now - last_sign:.0f} s ({what}={limit:g}); "
                       f"last seen {clock.seen or 'nothing from this attempt'}")
    return fresh, None


@dataclass
class Watch:
    """Progress clock of one local gang attempt: the last (state, step) seen and when it last moved."""

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
        status = RunFolder.of_gang(handle.path).read_status()
        fresh, stalled = look(self, status, _epoch(handle.started_at), now)
        out = {"state": gang.state, "detail": gang.detail, "status": status if fresh else {},
               "attempt": handle.attempt, "watch": self.as_dict()}
        if gang.state != local.RUNNING:
            return out
        if now > self.deadline:
            return {**out, "state": TIMED_OUT, "detail": "training gang exceeded compute.timeout_s"}
        if stalled:
            return {**out, "state": STALLED, "detail": stalled}
        return out

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StatusWatch:
    """Progress clock of a gang that something else runs and reports on (a Kubernetes Job): only the
    run's ``status.json`` and the attempt's start. Serializable, as a trigger's argument."""

    run_dir: str
    started: float                   # epoch seconds: the attempt's start (its Job's creation)
    stall_timeout_s: float
    startup_timeout_s: float
    seen: str = ""
    moved_at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stalled(self, now: float | None = None) -> str | None:
        """Why the attempt counts as stalled now, or None."""
        now = time.time() if now is None else now
        return look(self, RunFolder(Path(self.run_dir)).read_status(), self.started, now)[1]
