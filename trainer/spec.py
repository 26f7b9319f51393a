"""The trainer's input contract: one JSON file written by the launcher (``train/spec.json``).

It carries only what the trainer needs, so the image needs neither the config loader nor YAML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.model import GPTConfig


@dataclass(frozen=True)
class TrainSpec:
    run_dir: Path
    data: Path
    model: GPTConfig
    train: dict[str, Any]
    checkpoint: dict[str, Any]
    config_sha256: str
    backend: str = "auto"
    threads: int = 1
    parent: dict[str, Any] | None = None  # {"uri": ..., "weights": folder with model.safetensors + model.json}
    world_size: int | None = None         # processes the config asks for; a different count fails at startup
    cancel_grace_s: float = 25.0          # after SIGTERM, exit within this long even without a checkpoint

    @classmethod
    def load(cls, path: str | Path) -> TrainSpec:
        raw = json.loads(Path(path).read_text())
        return cls(run_dir=Path(raw["run_dir"]), data=Path(raw["data"]), model=GPTConfig(**raw["model"]),
                   train=raw["train"], checkpoint=raw["checkpoint"], config_sha256=raw["config_sha256"],
                   backend=raw.get("backend", "auto"), threads=raw.get("threads", 1),
                   parent=raw.get("parent"), world_size=raw.get("world_size"),
                   cancel_grace_s=raw.get("cancel_grace_s", 25.0))

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def export_dir(self) -> Path:
        return self.run_dir / "model"
