"""Checkpoints that are either complete and verified or ignored.

Layout: ``step-NNNNNNNN/`` with ``model.pt``, ``optim.pt``, ``rng-rank<R>.pt`` (every rank),
``meta.json`` (global step, tokens seen, sampler state, config sha256, parent) and
``checksums.json``, written last, into ``step-NNNNNNNN.inprogress/`` and then renamed (after
OLMo-core). Valid = renamed and every checksum matches. Resume takes the newest valid one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.fsio import sha256_file, write_json_atomic

log = logging.getLogger("trainer.checkpoint")
_NAME = re.compile(r"^step-(\d{8})$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def write_rank_state(root: Path, step: int, rank: int) -> None:
    """Every rank saves its own RNG state into the in-progress folder."""
    tmp = step_dir(root, step).with_suffix(".inprogress")
    tmp.mkdir(parents=True, exist_ok=True)
    torch.save(rng_state(), tmp / f"rng-rank{rank}.pt")


def finalize(root: Path, step: int, model_state: dict, optim_state: dict, meta: dict,
             keep_last_n: int) -> Path:
    """Rank 0, after every rank wrote its part: shared state, checksums last, atomic rename."""
    tmp = step_dir(root, step).with_suffix(".inprogress")
    torch.save(model_state, tmp / "model.pt")
    torch.save(optim_state, tmp / "optim.pt")
    write_json_atomic(tmp / "meta.json", meta)
    sums = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file()}
    write_json_atomic(tmp / "checksums.json", sums)
    final = step_dir(root, step)
    if final.exists():  # a resumed run re-saving a step it already saved
        shutil.rmtree(final)
    os.rename(tmp, final)
    _prune(root, keep_last_n)
    return final


def _prune(root: Path, keep_last_n: int) -> None:
    for old in sorted(_complete(root))[:-keep_last_n]:
        shutil.rmtree(old, ignore_errors=True)


def _complete(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and _NAME.match(p.name)] if root.is_dir() else []


def is_valid(path: Path) -> tuple[bool, str]:
    sums_file = path / "checksums.json"
    if not sums_file.is_file():
        return False, "no checksums.json"
    try:
        sums = json.loads(sums_file.read_text())
    except json.JSONDecodeError:
        return False, "checksums.json is not valid JSON"
    for name, expected in sums.items():
        file = path / name
        if not file.is_file():
            return False, f"{name} missing"
        if sha256_file(file) != expected:
            return False, f"{name} checksum mismatch"
    return True, "ok"


def latest_valid(root: Path) -> Path | None:
    """Newest checkpoint whose checksums all match; torn or corrupt newer ones are skipped loudly."""
    for path in sorted(_complete(root), reverse=True):
        ok, why = is_valid(path)
        if ok:
            return path
        log.warning("skipping invalid checkpoint %s: %s", path, why)
    return None


def load(path: Path, rank: int) -> dict[str, Any]:
    meta = json.loads((path / "meta.json").read_text())
    rng_file = path / f"rng-rank{rank}.pt"
    return {
        "meta": meta,
        "model": torch.load(path / "model.pt", map_location="cpu", weights_only=True),
        "optim": torch.load(path / "optim.pt", map_location="cpu", weights_only=True),
        "rng": torch.load(rng_file, weights_only=False) if rng_file.exists() else None,
    }
