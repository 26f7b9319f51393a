"""The launch spec: what to run, on how many nodes and processes, watched by which clocks; one spec for
every launcher, and the one place the config's ``compute`` node and process counts are read."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.run_folder import RunFolder
from trainer import fsio


@dataclass(frozen=True)
class LaunchSpec:
    run_dir: Path
    trainer_spec: Path            # JSON consumed by ``python -m trainer --spec``
    name: str                     # the launch's identity: an Airflow run id (a sweep member's own), or the folder's
    nodes: int
    procs_per_node: int
    threads_per_proc: int
    timeout_s: int
    stall_timeout_s: float = 300.0      # no step progress this long: stalled (``watch.look``)
    startup_timeout_s: float = 600.0    # the same before the first step of an attempt
    cancel_grace_s: float = 30.0  # SIGTERM → SIGKILL window of every node process
    unwatched_timeout_s: float = 600.0  # no watcher polled this long: the gang cancels itself
    try_number: int = 1           # the orchestrator's try: names a Kubernetes Job (a local gang counts its own)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def trainer_args(self) -> list[str]:
        return ["-m", "trainer", "--spec", str(self.trainer_spec)]


def write_trainer_spec(cfg: RunConfig, run_dir: Path, packed: Path, parent_weights: Path | None = None,
                       smoke: bool = False, parent_checkpoint: Path | None = None) -> Path:
    """Translate the RunConfig into the trainer's own contract (``trainer.spec.TrainSpec``); the
    smoke test's spec names its own output folder."""
    folder = RunFolder(run_dir)
    launch = launch_spec(cfg, run_dir)
    packed_manifest = json.loads((packed / "manifest.json").read_text())
    spec = {
        "paths": (folder.smoke_trainer if smoke else folder.trainer).to_dict(),
        "data": str(packed),
        "model": model_fields(cfg, packed_manifest["vocab_size"], parent_weights),
        "train": cfg.train.model_dump(),
        "checkpoint": cfg.checkpoint.model_dump(),
        "config_sha256": cfg.sha256(),
        "backend": cfg.compute.backend,
        "threads": launch.threads_per_proc,
        "parent": {"uri": cfg.parent or cfg.pretrained, "weights": str(parent_weights),
                   "checkpoint": str(parent_checkpoint) if parent_checkpoint else None} if parent_weights else None,
        "world_size": launch.world_size,
        # the trainer must be done before the launcher's SIGKILL: keep a margin for process exit
        "cancel_grace_s": max(1.0, cfg.compute.cancel_grace_s - 5.0),
        # progress shows in status.json only as often as it is rewritten: four rewrites per stall window,
        # so a slow step or a late read is never taken for a stall
        "status_every_s": min(5.0, cfg.compute.stall_timeout_s / 4),
        "schedule": lr_schedule(cfg),
    }
    return fsio.write_json(folder.smoke_spec if smoke else folder.trainer_spec, spec)


def model_fields(cfg: RunConfig, vocab_size: int, parent_weights: Path | None) -> dict[str, object]:
    """The model the trainer builds: the config's, or the parent's own when the run continues one (its
    architecture and shape are in its weights; a GPT version goes on as a GPT), with the config's dropout."""
    if parent_weights is None:
        return cfg.model.trainer_fields(vocab_size)
    if not (parent_weights / "model.json").is_file():  # a pretrained Hugging Face folder
        from trainer.llama import LlamaConfig  # torch (~1 s): DAG files import this module

        hf = LlamaConfig.from_hf(json.loads((parent_weights / "config.json").read_text()))
        return {"arch": "llama", **hf.to_dict(), "dropout": cfg.model.dropout}
    theirs = json.loads((parent_weights / "model.json").read_text())["config"]
    return {"arch": "gpt", **theirs, "dropout": cfg.model.dropout}  # written before arch existed: a GPT


def lr_schedule(cfg: RunConfig) -> dict[str, object]:
    """The LR schedule (``trainer.spec.ScheduleSettings``) of ``cfg.lr_schedule``'s kind."""
    if cfg.lr_schedule == "wsd":
        return {"kind": "wsd", "decay_steps": cfg.refresh.decay_steps}
    return {"kind": "rewarm", "decay_steps": 0}


def launch_spec(cfg: RunConfig, run_dir: Path, name: str | None = None, try_number: int = 1) -> LaunchSpec:
    """The run's launch: ``compute`` as every launcher reads it, the trainer's spec in the run folder."""
    c = cfg.compute
    return LaunchSpec(run_dir=run_dir, trainer_spec=RunFolder(run_dir).trainer_spec, name=name or run_dir.name,
                      nodes=c.nodes, procs_per_node=c.procs_per_node, threads_per_proc=c.threads_per_proc,
                      timeout_s=c.timeout_s, stall_timeout_s=c.stall_timeout_s, startup_timeout_s=c.startup_timeout_s,
                      cancel_grace_s=c.cancel_grace_s, unwatched_timeout_s=c.unwatched_timeout_s,
                      try_number=try_number)
