"""Training (docs/trainer.md, docs/deploy.md): the trainer's spec for the packed data, its
one-process ``smoke`` test, then the gang of nodes, on either launcher.

Local gang (``pipelines/launch/local.py``): ``run`` to the end in this process (the CLI), or for
Airflow ``submit`` → ``state`` (through a ``Watch``) until it ends → ``finish``; ``cancel`` at any
time, ``report`` meanwhile. Handing the gang from one watcher to the next (a task deferring to its
trigger) goes through ``hand_over``/``take_over``, so the gang's nodes know someone still watches.
Kubernetes: the pods belong to the provider's operator; ``render_kubernetes`` makes them from the
run's config and ``finish`` completes the run the same way. Nothing outside this module uses
``pipelines.launch``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines import disk, hf_folder, registry
from pipelines.config import RunConfig
from pipelines.errors import CheckFailed
from pipelines.launch import k8s, local
from pipelines.launch.k8s import Gang
from pipelines.launch.local import GangFailed, GangTimedOut, Handle
from pipelines.launch.spec import launch_spec, write_trainer_spec
from pipelines.launch.watch import STALLED, SUPERSEDED, TIMED_OUT, StatusWatch, Watch
from pipelines.registry import lineage
from pipelines.registry.metrics import last_record
from pipelines.run_folder import RunFolder, State
from pipelines.stages import parent, pretrained
from pipelines.stages.prepare import load_run_config, require
from trainer import fsio

__all__ = ["CONTAINER", "GANG_LABEL", "STALLED", "SUPERSEDED", "TIMED_OUT", "Gang", "GangFailed", "GangTimedOut", "Handle",
           "SmokeFailed", "State", "StatusWatch", "TRY_LABEL", "Watch", "cancel", "canceled_by_user", "cleanup", "current", "final_checkpoint_ready",
           "finish", "hand_over", "job_watch", "launched_here", "load", "progress_line", "progress_ticker", "render_kubernetes", "report", "report_attempt",
           "run", "smoke", "spec", "started_up", "state", "submit", "take_over", "watch"]

CONTAINER = k8s.CONTAINER      # the trainer's container in every node pod
GANG_LABEL = k8s.GANG_LABEL    # selects every pod of a run's gang, all tries
TRY_LABEL = k8s.TRY_LABEL      # the Airflow try that created a Job


class SmokeFailed(CheckFailed):
    """The trainer's one-process smoke test failed: config or code cannot train."""


# the trainer's input ------------------------------------------------------------------------------

def spec(cfg: RunConfig, run_dir: Path, smoke: bool = False) -> Path:
    """The trainer's spec for the packed data (and parent weights): the run's own, or the smoke
    test's (which names its own, emptied, output folder). The run's own is refused (``DiskFull``)
    when its disk cannot hold its checkpoints: every launcher writes it just before launching."""
    folder = RunFolder(run_dir)
    require(folder.packed_link, "tokenize")
    if not smoke:
        disk.check_training_room(pretrained.effective(cfg, run_dir), folder.checkpoints)  # the model it trains
    packed = Path(lineage.packed_info(run_dir)["path"])
    if smoke:
        shutil.rmtree(folder.smoke, ignore_errors=True)
    weights = parent.weights(cfg, run_dir)
    return write_trainer_spec(cfg, run_dir, packed, weights, smoke=smoke,
                              parent_checkpoint=parent.checkpoint(cfg, weights) if weights and cfg.parent else None)


def smoke(cfg: RunConfig, run_dir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """The trainer's ``--smoke`` on one process: config and code errors fail here in seconds,
    before a gang of nodes is scheduled."""
    path = spec(cfg, run_dir, smoke=True)
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(path), "--smoke"], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SmokeFailed(f"trainer smoke test failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1])


# the local gang -----------------------------------------------------------------------------------

def run(cfg: RunConfig, run_dir: Path, on_poll: Callable[[], None] | None = None) -> Path:
    """Run the trainer as a local gang to its end; returns the exported model folder."""
    local.run_to_end(launch_spec(cfg, run_dir, spec(cfg, run_dir)), on_poll=on_poll)
    return finish(run_dir)


def submit(cfg: RunConfig, run_dir: Path) -> Handle:
    """Start the run's gang without waiting (the Airflow sensor watches it); an earlier gang of the
    run is stopped first."""
    return local.submit(launch_spec(cfg, run_dir, spec(cfg, run_dir)))


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
        return State.CANCELED
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
    return report_attempt(RunFolder.of_gang(handle.path).root, run_key, handle.attempt,
                          datetime.fromisoformat(handle.started_at).timestamp())


def report_attempt(run_dir: Path, run_key: str, attempt: int, started: float) -> str | None:
    """``report`` for any launcher: attempt ``attempt`` (1 = no restart yet) started at epoch ``started``."""
    registry.ship(load_run_config(run_dir), run_dir, run_key, restarts=attempt - 1)
    line = progress_line(run_dir, time.time() - started)
    return f"attempt {attempt}: {line}" if line else None


# Kubernetes ---------------------------------------------------------------------------------------

def render_kubernetes(cfg: RunConfig, run_dir: Path, run_id: str, try_number: int) -> Gang:
    """The gang's Service and Indexed Job for one try (the spec they run is ``spec``'s)."""
    command = launch_spec(cfg, run_dir, RunFolder(run_dir).trainer_spec).trainer_args()
    return k8s.render(cfg, run_id=run_id, try_number=try_number, command=command)


def job_watch(cfg: RunConfig, run_dir: Path, started: float) -> StatusWatch:
    """The progress clock a Job's trigger keeps (the Job itself enforces ``compute.timeout_s``)."""
    return StatusWatch(str(run_dir), started, cfg.compute.stall_timeout_s, cfg.compute.startup_timeout_s)


# both launchers -----------------------------------------------------------------------------------

def finish(run_dir: Path) -> Path:
    """Training ended well: the exported model folder, completed with the tokenizer files evaluation
    and registry need (and a Llama's Hugging Face files: pipelines/hf_folder.py)."""
    model_dir = RunFolder(run_dir).model
    require(model_dir / "model.safetensors", "train")
    packed = Path(lineage.packed_info(run_dir)["path"])
    for name in ("tokenizer.json", "token_bytes.npy"):
        fsio.write_bytes(model_dir / name, (packed / name).read_bytes())
    hf_folder.complete(model_dir, load_run_config(run_dir).tokenizer.eos_token)
    return model_dir


def final_checkpoint_ready(run_dir: Path) -> tuple[bool, str]:
    """Training succeeded, its newest valid checkpoint is the final step and the export matches it."""
    from trainer import checkpoint  # torch (~1 s): DAG files import this module through their tasks

    folder = RunFolder(run_dir)
    status = folder.read_status()
    if status.get("state") != State.SUCCEEDED:
        return False, f"trainer state is {status.get('state')!r}, waiting for 'succeeded'"
    newest = checkpoint.latest_valid(folder.checkpoints)
    if newest is None:
        return False, "no valid checkpoint yet"
    step = json.loads((newest / "meta.json").read_text())["global_step"]
    exported = folder.model / "model.json"
    if not exported.exists():
        return False, "weights not exported yet"
    if step != status.get("step") or json.loads(exported.read_text()).get("global_step") != step:
        return False, f"newest valid checkpoint {newest.name} is not the final step {status.get('step')}"
    return True, f"final checkpoint {newest.name} is complete and valid; export matches it"


def progress_line(run_dir: Path, elapsed_s: float) -> str | None:
    """One human line from ``status.json``: step/total, loss, tokens/s, ETA (``elapsed_s`` since launch)."""
    s = RunFolder(run_dir).read_status()
    if not s:
        return None
    step, total = s.get("step") or 0, s.get("total_steps") or 0
    if s.get("loss") is None or s.get("tokens_per_s") is None:  # a relaunch that logged no step yet
        last = last_record(run_dir)
        s = {**s, "loss": s.get("loss") or last.get("loss"), "tokens_per_s": s.get("tokens_per_s") or last.get("tokens_per_s")}
    eta = f"{elapsed_s / step * (total - step):.0f}s" if step else "?"
    return (f"{s.get('state')} step {step}/{total} loss {s.get('loss')} "
            f"tokens/s {s.get('tokens_per_s')} eta {eta}")


def progress_ticker(run_dir: Path, emit: Callable[[str], None], every_s: float = 10.0) -> Callable[[], None]:
    """A poll callback that emits ``progress_line`` at most every ``every_s`` seconds."""
    started, last = time.monotonic(), [0.0]

    def tick() -> None:
        if time.monotonic() - last[0] >= every_s:
            last[0] = time.monotonic()
            if line := progress_line(run_dir, time.monotonic() - started):
                emit(line)

    return tick
