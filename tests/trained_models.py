"""Run folders holding tiny GPTs of chosen quality, for the evaluation and registry tests.

Preflight and tokenize run for real (the tokenize cache makes every run after the first a
hit); the model is trained in this process for a given number of steps (more steps = a better
model), which takes about a second instead of a gang launch. Trained folders are reused
within a test session.
"""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from conftest import TINY


def make_run(home: Path, label: str, steps: int, overrides: list[str] | None = None, seed: int = 0,
             preflight: bool = False) -> Path:
    """``home/runs/<label>``: config, packed data (and the preflight report when asked), and a
    model trained ``steps`` steps."""
    from pipelines import stages
    from pipelines.config import load_config

    cfg = load_config(TINY, overrides or [])
    run_dir = home / "runs" / label
    if (run_dir / "model" / "model.safetensors").exists():
        return run_dir
    stages.prepare.prepare(cfg, run_dir)
    if preflight and not (run_dir / "preflight" / "report.json").exists():
        stages.preflight.run(cfg, run_dir)
    stages.tokenize.reduce(cfg, run_dir)
    train_in_process(run_dir, cfg, steps, seed)
    return run_dir


def train_in_process(run_dir: Path, cfg, steps: int, seed: int) -> Path:
    import torch

    from pipelines import stages
    from trainer import arch, weights
    from trainer.data import PackedSplit

    packed = Path(json.loads((run_dir / "tokenize" / "packed.json").read_text())["path"])
    data = PackedSplit(packed, "train")
    torch.manual_seed(seed)
    model_cfg = arch.config_from_dict(cfg.model.trainer_fields(data.manifest["vocab_size"]), "config")
    model = arch.build(model_cfg)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    rng = np.random.default_rng(seed)
    model.train()
    curve = []
    for step in range(1, steps + 1):
        x, y, d = (torch.from_numpy(a) for a in data.batch(rng.integers(0, len(data), 16)))
        _, loss = model(x, y, d)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        if step % 10 == 0:  # the trainer's metrics.jsonl lines, which registration logs as curves
            curve.append(json.dumps({"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "step": step,
                                     "loss": round(loss.item(), 5), "lr": cfg.train.lr}) + "\n")
    (run_dir / "metrics.jsonl").write_text("".join(curve))
    folder = run_dir / "model"
    weights.export(model.state_dict(), model_cfg, folder, {"global_step": steps})
    return stages.train.finish(run_dir)  # the tokenizer files, and a Llama's Hugging Face files


def clone_run(home: Path, src: Path, label: str, overrides: list[str]) -> Path:
    """Another run folder (another config: model name, experiment, eval settings) holding the
    same packed data and model as ``src``; no training."""
    from pipelines import stages
    from pipelines.config import load_config

    cfg = load_config(TINY, overrides)
    run_dir = home / "runs" / label
    if run_dir.exists():
        shutil.rmtree(run_dir)
    stages.prepare.prepare(cfg, run_dir)
    for part in ("preflight", "tokenize", "model"):
        if (src / part).exists():
            shutil.copytree(src / part, run_dir / part)
    if (src / "metrics.jsonl").exists():
        shutil.copyfile(src / "metrics.jsonl", run_dir / "metrics.jsonl")
    return run_dir
