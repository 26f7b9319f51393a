"""Load an exported model folder (``model.json`` + ``model.safetensors``) or say exactly what is wrong.

A missing file, a truncated or garbled weights file, weights that do not fit the declared
architecture, non-finite values, or a sha256 that differs from the one recorded at
registration all raise ``ModelFileError`` naming the file and the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trainer import arch, weights
from trainer.fsio import sha256_file


class ModelFileError(ValueError):
    """A model folder that cannot be evaluated or served."""


def resolve_device(device: str) -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ModelFileError("eval.device: cuda requested but no GPU is visible")
    return device


def load_model(folder: str | Path, device: str = "cpu", sha256: str | None = None) -> tuple[arch.CausalLM, dict]:
    folder = Path(folder)
    spec, tensors = folder / "model.json", folder / "model.safetensors"
    if not spec.is_file() and (folder / "config.json").is_file():  # a Hugging Face folder (a pretrained start)
        return _checked(*_loaded(folder, device, folder), tensors)
    for path in (spec, tensors):
        if not path.is_file():
            raise ModelFileError(f"{path}: missing (was the model exported by the train stage?)")
    try:
        info = json.loads(spec.read_text())
        arch.config_from_dict(info["config"], str(spec))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise ModelFileError(f"{spec}: not a model description ({type(exc).__name__}: {exc})") from None
    except ValueError as exc:  # a model Taxiway does not build: the message names the file and field
        raise ModelFileError(str(exc)) from None
    if sha256 is not None and (actual := sha256_file(tensors)) != sha256:
        raise ModelFileError(f"{tensors}: sha256 {actual[:12]}… differs from the recorded {sha256[:12]}… "
                             "(corrupted copy)")
    return _checked(*_loaded(folder, device, tensors), tensors)


def _loaded(folder: Path, device: str, where: Path) -> tuple[arch.CausalLM, dict]:
    try:
        return weights.load(folder, device)
    except ValueError as exc:
        raise ModelFileError(str(exc)) from None
    except Exception as exc:  # safetensors raises its own SafetensorError for a bad header or size
        raise ModelFileError(f"{where}: unreadable weights ({type(exc).__name__}: {exc})") from None


def _checked(model: arch.CausalLM, info: dict, tensors: Path) -> tuple[arch.CausalLM, dict]:
    for name, tensor in model.state_dict().items():
        if not torch.isfinite(tensor).all():
            raise ModelFileError(f"{tensors}: tensor {name} holds NaN or Inf values")
    return model, info
