"""Weights-only export and import (safetensors + model.json) for evaluation and the registry."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from trainer.model import GPT, GPTConfig

_TIED = "lm_head.weight"


def export(state: dict, cfg: GPTConfig, folder: Path, extra: dict | None = None) -> Path:
    """Write ``model.safetensors`` and ``model.json`` into ``folder`` atomically (staged + rename).

    ``extra`` is training metadata (global step, tokens seen, LR schedule) that a run continuing
    from this model reads back, so its counters and schedule go on from here.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items() if k != _TIED}
    save_file(tensors, str(tmp / "model.safetensors"))
    (tmp / "model.json").write_text(json.dumps({"config": cfg.to_dict(), **(extra or {})}, indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    os.rename(tmp, folder)
    return folder


def load(folder: str | Path, device: str = "cpu") -> tuple[GPT, dict]:
    """Rebuild the model from ``model.json`` and load ``model.safetensors``."""
    folder = Path(folder)
    info = json.loads((folder / "model.json").read_text())
    model = GPT(GPTConfig(**info["config"]))
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors"), device=device),
                                                strict=False)
    if set(missing) - {_TIED} or unexpected:
        raise ValueError(f"{folder}: weights do not match model.json (missing {missing}, unexpected {unexpected})")
    return model.to(device), info
