"""Free disk, checked before training fills it: a full disk found at a checkpoint costs the run's
time since the last one, found before launch it costs nothing.

The size of one checkpoint is estimated from the config alone (``limits.checkpoint_bytes``; no
torch: this runs in Airflow workers). The trainer checks again before every checkpoint with the
exact bytes (``trainer.checkpoint.ensure_room``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.config.limits import checkpoint_bytes, checkpoints_held
from pipelines.errors import CheckFailed


class DiskFull(CheckFailed):
    """Not enough free disk for what a stage is about to write: never retried, since the same
    disk 30 s later is no emptier; someone must free space or choose smaller settings."""


def free_bytes(folder: Path) -> int:
    """Bytes a non-root writer may still use where ``folder`` is, or will be once created."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize


def _bytes_under(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when absent); a file pruned while counted counts 0."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB ({n:,} bytes)"


def check_free(folder: Path, need_bytes: int, what: str) -> None:
    """Raise ``DiskFull`` naming the folder, the bytes ``what`` needs and those free."""
    free = free_bytes(folder)
    if free < need_bytes:
        raise DiskFull(f"not enough free disk in {folder}: {what} needs {_size(need_bytes)}, only {_size(free)} "
                       "is free; free space there or put the run on a larger disk")


def check_training_room(cfg: RunConfig, checkpoints: Path) -> None:
    """Room for the checkpoints a run holds at its peak (``limits.checkpoints_held``: those kept, the one
    being written, a wsd run's stable one), less what its checkpoints folder already holds: a relaunch
    resumes from those."""
    each, keep, peak = checkpoint_bytes(cfg), cfg.checkpoint.keep_last_n, checkpoints_held(cfg)
    held = _bytes_under(checkpoints)
    need = max(each, peak * each - held)
    check_free(checkpoints, need, f"training ({peak} checkpoints of ~{_size(each)}: checkpoint.keep_last_n={keep} "
                                  f"kept + 1 being written{' + the wsd stable state' if peak > keep + 1 else ''}, "
                                  f"less {_size(held)} already there; a lower checkpoint.keep_last_n needs less)")
