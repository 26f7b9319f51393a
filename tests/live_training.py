"""What live tests need to follow a training gang from outside: its handle, its launches, its steps,
and the task process that launched it."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from live_airflow import wait_for

from pipelines.launch import local


def gang_handle(run_dir: Path) -> local.Handle | None:
    try:
        return local.Handle.load(local.handle_path(run_dir))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def new_gang(run_dir: Path, old: str | None, explain: Callable[[], str], timeout_s: float = 180) -> local.Handle:
    return wait_for("a new gang", lambda: (h := gang_handle(run_dir)) and h.gang_id != old and h, timeout_s, every_s=0.02,
                    explain=explain)


def stepping(run_dir: Path, handle: local.Handle, min_step: int) -> int:
    """Wait until this gang's own status says running at ``min_step`` or later; returns the step."""
    started = datetime.fromisoformat(handle.started_at).timestamp()

    def probe():
        try:
            s = json.loads((run_dir / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        fresh = s.get("heartbeat_at") and datetime.fromisoformat(s["heartbeat_at"]).timestamp() >= started
        assert local.poll(handle).state == local.RUNNING, local.poll(handle).detail
        return fresh and s["state"] == "running" and s["step"] >= min_step and s["step"]

    return wait_for(f"gang {handle.gang_id} to reach step {min_step}", probe, 120, every_s=0.2)


def task_process(ti_id: str) -> int:
    """The task runner of this try: Airflow titles it ``airflow worker -- <ti id>``."""
    def probe():
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and f"airflow worker -- {ti_id}".encode() in (entry / "cmdline").read_bytes():
                    return int(entry.name)
            except (FileNotFoundError, ProcessLookupError):
                continue
        return None

    return wait_for(f"the task process of {ti_id}", probe, 10, every_s=0.01)
