"""The training stage's API: the one seam both launchers' Airflow operators use.

Local gang (``pipelines/launch/local.py``): ``submit`` → ``look`` (through a ``Watch``) until it
ends → ``finish``; ``cancel`` at any time, ``report`` meanwhile. Handing the gang from one watcher
to the next (a task deferring to its trigger) goes through ``hand_over``/``take_over``, so the
gang's nodes know someone still watches. Kubernetes: the pods belong to the provider's operator;
``render_kubernetes`` makes them from the run's config and ``finish`` completes the run the same
way. Nothing outside ``pipelines`` needs ``pipelines.launch`` or its names.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

from pipelines import registry, stages
from pipelines.config import RunConfig
from pipelines.launch import k8s, local
from pipelines.launch.local import GangFailed, GangTimedOut, Handle
from pipelines.launch.spec import launch_spec
from pipelines.launch.watch import STALLED, SUPERSEDED, TIMED_OUT, Watch
from pipelines.run_folder import RunFolder, State

__all__ = ["CONTAINER", "GANG_LABEL", "STALLED", "SUPERSEDED", "TIMED_OUT", "GangFailed", "GangTimedOut", "Handle", "State",
           "Watch", "cancel", "canceled_by_user", "cleanup", "current", "final_checkpoint_ready", "finish", "hand_over", "launched_here", "load", "report",
           "render_kubernetes", "started_up", "state", "submit", "take_over", "watch", "write_spec"]

CONTAINER = k8s.CONTAINER      # the trainer's container in every node pod
GANG_LABEL = k8s.GANG_LABEL    # selects every pod of a run's gang, all tries
CANCELED = State.CANCELED


# local gang -------------------------------------------------------------------------------------

def submit(cfg: RunConfig, run_dir: Path) -> Handle:
    """Start the run's gang without waiting; an earlier gang of the run is stopped first."""
    return stages.launch_gang(cfg, run_dir)


def load(handle_json: str | Path) -> Handle:
    return Handle.load(Path(handle_json))


def current(run_dir: Path) -> Handle | None:
    """The run's newest gang, None before the first launch."""
    path = RunFolder(run_dir).gang
    return Handle.load(path) if path.exists() else None


def launched_here(handle: Handle) -> bool:
    return local.launched_here(handle)


def state(handle: Handle) -> str:
    """``running``, ``succeeded``, ``failed``, or ``canceled`` when a user canceled it (a gang
    canceled by a user is never re-attached to: a new try launches afresh)."""
    if canceled_by_user(handle):
        return CANCELED
    return local.poll(handle).state


def canceled_by_user(handle: Handle) -> bool:
    return local.cancel_reason(handle) == local.USER


def started_up(handle: Handle, run_dir: Path) -> bool:
    """The trainer of this launch wrote its first heartbeat."""
    heartbeat = RunFolder(run_dir).read_status().get("heartbeat_at")
    return bool(heartbeat) and datetime.fromisoformat(heartbeat) >= datetime.fromisoformat(handle.started_at)


def cancel(handle: Handle, by_user: bool = True) -> None:
    """SIGTERM the gang (once): the trainer checkpoints and exits; its nodes enforce the grace."""
    local.cancel(handle, local.USER if by_user else local.CLEANUP)


def cleanup(handle: Handle, grace_s: float) -> int:
    """Stop whatever is left of the gang; returns the processes killed."""
    return local.cleanup(handle, grace_s)


def hand_over(handle: Handle) -> None:
    local.hand_over(handle)


def take_over(handle: Handle) -> None:
    local.take_over(handle)


def watch(handle: Handle, cfg: RunConfig) -> Watch:
    """The progress clock a waiting sensor keeps: stall, startup and overall deadlines from ``compute``."""
    c = cfg.compute
    started = datetime.fromisoformat(handle.started_at).timestamp()
    return Watch(str(handle.path), handle.gang_id, c.stall_timeout_s, c.startup_timeout_s, started + c.timeout_s)


def report(handle: Handle, run_key: str) -> str | None:
    """Ship unshipped metric lines and the restart count to MLflow; return the progress line."""
    run_dir = RunFolder.of_gang(handle.path).root
    registry.ship(stages.load_run_config(run_dir), run_dir, run_key, restarts=handle.attempt - 1)
    line = stages.progress_line(run_dir, time.time() - datetime.fromisoformat(handle.started_at).timestamp())
    return f"attempt {handle.attempt}: {line}" if line else None


# both launchers ---------------------------------------------------------------------------------

def finish(run_dir: Path) -> Path:
    """Training ended well: the exported model folder, completed for evaluation and registry."""
    return stages.finish_train(run_dir)


def final_checkpoint_ready(run_dir: Path) -> tuple[bool, str]:
    """Training succeeded, its newest valid checkpoint is the final step and the export matches it."""
    return stages.final_checkpoint_ready(run_dir)


def write_spec(cfg: RunConfig, run_dir: Path) -> Path:
    """The trainer's spec in the run folder (before pods that read it are created)."""
    return stages.trainer_spec(cfg, run_dir)


def render_kubernetes(cfg: RunConfig, run_dir: Path, run_id: str, try_number: int) -> k8s.Gang:
    """The gang's Service and Indexed Job for one try (the spec they run is ``write_spec``'s)."""
    command = launch_spec(cfg, run_dir, RunFolder(run_dir).trainer_spec).trainer_args()
    return k8s.render(cfg, run_id=run_id, try_number=try_number, command=command)
