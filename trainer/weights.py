"""Weights-only export and import (safetensors + model.json) for evaluation and the registry.

A Llama export is also a Hugging Face folder: its tensors carry ``LlamaForCausalLM``'s names and a
``config.json`` describes them, so ``transformers`` loads it as it is (``pipelines/stages/train.finish``
adds the tokenizer files)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import load_file, save_file

from trainer import arch
from trainer.llama import Llama, LlamaConfig, load_state, read_folder

_HEAD = "lm_head.weight"


def export(state: dict, cfg: arch.Config, folder: Path, extra: dict | None = None) -> Path:
    """Write ``model.safetensors`` and ``model.json`` into ``folder`` atomically (staged + rename), from
    a state held whole in memory (tests, benchmarks; the trainer streams: ``shards.write_weights``).

    ``extra`` is training metadata (global step, tokens seen, LR schedule) that a run continuing
    from this model reads back, so its counters and schedule go on from here.
    """
    tmp = staging(folder)
    tied = arch.tied(cfg)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in state.items() if not (tied and k == _HEAD)}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    return complete(tmp, cfg, folder, extra)


def staging(folder: Path) -> Path:
    """A new, empty folder beside ``folder`` to write its export into."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))


def complete(tmp: Path, cfg: arch.Config, folder: Path, extra: dict | None = None) -> Path:
    """``tmp`` holds ``model.safetensors``: add ``model.json`` (and a Llama's ``config.json``) and
    rename it to ``folder``, replacing an earlier export."""
    (tmp / "model.json").write_text(json.dumps({"config": arch.describe(cfg), **(extra or {})}, indent=2))
    if isinstance(cfg, LlamaConfig):
        (tmp / "config.json").write_text(json.dumps(cfg.to_hf(), indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    os.rename(tmp, folder)
    return folder


def load(folder: str | Path, device: str = "cpu") -> tuple[arch.CausalLM, dict]:
    """Rebuild the model from ``model.json`` and load ``model.safetensors``; a Hugging Face folder without
    Taxiway's ``model.json`` (a pretrained start) from its ``config.json``, with no training metadata."""
    folder = Path(folder)
    if not (folder / "model.json").is_file() and (folder / "config.json").is_file():
        cfg, state = read_folder(folder)
        model = Llama(cfg)
        load_state(model, state, str(folder))
        return model.to(device), {}
    info = json.loads((folder / "model.json").read_text())
    cfg = arch.config_from_dict(info["config"], str(folder / "model.json"))
    model = arch.build(cfg)
    missing, unexpected = model.load_state_dict(load_file(str(folder / "model.safetensors"), device=device),
                                                strict=False)
    if set(missing) - ({_HEAD} if arch.tied(cfg) else set()) or unexpected:
        raise ValueError(f"{folder}: weights do not match model.json (missing {missing}, unexpected {unexpected})")
    return model.to(device), info
