"""The trainer's input contract: one JSON file written by the launcher (``train/spec.json``).

It carries only what the trainer needs, typed, so the image needs neither the config loader nor
YAML, and a launcher that writes a field the trainer does not know (or leaves one out) fails at
load time naming it, not at the step that first reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from trainer import arch
from trainer.paths import TrainerPaths


def _typed(cls: type, raw: dict[str, Any], where: str) -> Any:
    names = {f.name for f in fields(cls)}
    if unknown := sorted(set(raw) - names):
        raise ValueError(f"spec.json {where}: unknown field(s) {', '.join(unknown)}")
    if missing := sorted(names - set(raw)):
        raise ValueError(f"spec.json {where}: missing field(s) {', '.join(missing)}")
    return cls(**raw)


@dataclass(frozen=True)
class TrainSettings:
    """The RunConfig's ``train`` section, as the trainer reads it."""

    steps: int
    batch_size: int
    grad_accum: int
    lr: float
    min_lr: float
    warmup_steps: int
    rewarmup_steps: int
    weight_decay: float
    grad_clip: float
    decay: Literal["cosine", "linear"]
    seed: int
    log_every: int
    deterministic: bool
    parallel: Literal["ddp", "fsdp"]
    precision: Literal["auto", "fp32", "bf16"]
    peak_tflops: float | None
    max_nonfinite_steps: int
    spike_window: int
    spike_sigma: float
    data_timeout_s: int


@dataclass(frozen=True)
class CheckpointSettings:
    every_steps: int
    keep_last_n: int
    async_save: bool


@dataclass(frozen=True)
class ScheduleSettings:
    """How the LR schedule is shaped (``trainer.schedule``): ``rewarm`` or ``wsd`` with its decay length.
    Not in the ``train`` section: the deployment's ``refresh.schedule`` chooses it for runs that continue a parent."""

    kind: Literal["rewarm", "wsd"] = "rewarm"
    decay_steps: int = 0


@dataclass(frozen=True)
class Parent:
    uri: str
    weights: Path  # folder with model.safetensors + model.json
    checkpoint: Path | None = None  # its full checkpoint (optimizer state too) to continue, if kept: the
    #                                 exported step's, or with a wsd schedule its stable (pre-decay) step's


@dataclass(frozen=True)
class TrainSpec:
    paths: TrainerPaths
    data: Path
    model: arch.Config
    train: TrainSettings
    checkpoint: CheckpointSettings
    config_sha256: str
    backend: str = "auto"
    threads: int = 1
    parent: Parent | None = None
    world_size: int | None = None         # processes the config asks for; a different count fails at startup
    cancel_grace_s: float = 25.0          # after SIGTERM, exit within this long even without a checkpoint
    status_every_s: float = 5.0           # status.json rewritten at least this often: well inside the stall window
    schedule: ScheduleSettings = ScheduleSettings()

    @classmethod
    def load(cls, path: str | Path) -> TrainSpec:
        raw = json.loads(Path(path).read_text())
        parent = raw.get("parent")
        return cls(paths=TrainerPaths.from_dict(raw["paths"]), data=Path(raw["data"]),
                   model=arch.config_from_dict(raw["model"], "spec.json model"), train=_typed(TrainSettings, raw["train"], "train"),
                   checkpoint=_typed(CheckpointSettings, raw["checkpoint"], "checkpoint"),
                   config_sha256=raw["config_sha256"], backend=raw.get("backend", "auto"),
                   threads=raw.get("threads", 1),
                   parent=_parent(parent) if parent else None,
                   world_size=raw.get("world_size"), cancel_grace_s=raw.get("cancel_grace_s", 25.0),
                   status_every_s=raw.get("status_every_s", 5.0),
                   schedule=_typed(ScheduleSettings, raw.get("schedule", {"kind": "rewarm", "decay_steps": 0}),
                                   "schedule"))

    @property
    def checkpoints(self) -> Path:
        return self.paths.checkpoints

    @property
    def export_dir(self) -> Path:
        return self.paths.export


def _parent(raw: dict[str, Any]) -> Parent:
    return Parent(raw["uri"], Path(raw["weights"]), Path(raw["checkpoint"]) if raw.get("checkpoint") else None)
