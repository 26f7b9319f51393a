"""Training (docs/trainer.md, docs/deploy.md): the trainer's spec for the packed data, its one-process
``smoke`` test, the gang on a launcher (``pipelines.launch``: one protocol, a local and a Kubernetes
launcher, which the Airflow operators hold), then ``finish``: the exported model completed for
evaluation and registry. ``run`` is the CLI's whole stage on the local launcher; ``report`` is what a
watcher of either launcher ships meanwhile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines import disk, hf_folder, registry
from pipelines.config import RunConfig
from pipelines.errors import CheckFailed
from pipelines.launch import local
from pipelines.launch.spec import LaunchSpec, launch_spec, write_trainer_spec
from pipelines.registry import lineage
from pipelines.registry.metrics import last_record
from pipelines.run_folder import RunFolder, State
from pipelines.stages import parent, pretrained
from pipelines.stages.prepare import load_run_config, require
from trainer import fsio


class SmokeFailed(CheckFailed):
    """The trainer's one-process smoke test failed: config or code cannot train."""


# the trainer's input ------------------------------------------------------------------------------

def spec(cfg: RunConfig, run_dir: Path, name: str | None = None, try_number: int = 1) -> LaunchSpec:
    """The run's launch, its trainer's spec written for the packed data (and parent weights). Refused
    (``DiskFull``) when the run's disk cannot hold its checkpoints: every launch writes it just before."""
    folder = RunFolder(run_dir)
    require(folder.packed_link, "tokenize")
    disk.check_training_room(pretrained.effective(cfg, run_dir), folder.checkpoints)  # the model it trains
    _trainer_spec(cfg, run_dir)
    return launch_spec(cfg, run_dir, name, try_number)


def _trainer_spec(cfg: RunConfig, run_dir: Path, smoke: bool = False) -> Path:
    """The run's own trainer spec, or the smoke test's (which names its own, emptied, output folder)."""
    folder = RunFolder(run_dir)
    require(folder.packed_link, "tokenize")
    packed = Path(lineage.packed_info(run_dir)["path"])
    if smoke:
        shutil.rmtree(folder.smoke, ignore_errors=True)
    weights = parent.weights(cfg, run_dir)
    return write_trainer_spec(cfg, run_dir, packed, weights, smoke=smoke,
                              parent_checkpoint=parent.checkpoint(cfg, weights) if weights and cfg.parent else None)


def smoke(cfg: RunConfig, run_dir: Path, timeout_s: float = 600.0) -> dict[str, Any]:
    """The trainer's ``--smoke`` on one process: config and code errors fail here in seconds,
    before a gang of nodes is scheduled."""
    path = _trainer_spec(cfg, run_dir, smoke=True)
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(path), "--smoke"], capture_output=True,
                          text=True, timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise SmokeFailed(f"trainer smoke test failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return json.loads(lines[-1])


# the local gang (the CLI) ------------------------------------------------------------------------

def run(cfg: RunConfig, run_dir: Path, on_poll: Callable[[], None] | None = None) -> Path:
    """Run the trainer as a local gang to its end; returns the exported model folder."""
    local.run_to_end(spec(cfg, run_dir), on_poll=on_poll)
    return finish(run_dir)


def report(run_dir: Path, run_key: str, attempt: int, started: float) -> str | None:
    """Ship unshipped metric lines and the restart count to MLflow; return the progress line. For a gang
    on either launcher: attempt ``attempt`` (1 = no restart yet) started at epoch ``started``."""
    registry.ship(load_run_config(run_dir), run_dir, run_key, restarts=attempt - 1)
    line = progress_line(run_dir, time.time() - started)
    return f"attempt {attempt}: {line}" if line else None


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
