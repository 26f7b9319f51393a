"""Free disk, checked before training fills it: a full disk found at a checkpoint costs the run's
time since the last one, found before launch it costs nothing.

The size of one checkpoint is estimated from the config alone (no torch: this runs in Airflow
workers): the model's parameters (``trainer/model.py``'s layout) in fp32, AdamW's two moments of
each, torch.save's few hundred bytes per tensor and every rank's RNG state. The trainer checks
again before every checkpoint with the exact bytes (``trainer.checkpoint.ensure_room``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.errors import CheckFailed

FP32 = 4
PER_TENSOR_BYTES = 1 << 10  # zip records and pickle of a weight, its two moments and step count (~1.2 KB measured)
EXTRA_BYTES = 4 << 10       # meta.json, checksums.json
RNG_BYTES = 16 << 10        # each rank's RNG state (~14 KB measured)


class DiskFull(CheckFailed):
    """Not enough free disk for what a stage is about to write: never retried, since the same
    disk 30 s later is no emptier; someone must free space or choose smaller settings."""


def checkpoint_bytes(cfg: RunConfig) -> int:
    """Estimated bytes of one checkpoint of ``cfg``'s model, with the configured vocabulary (a
    tokenizer trained for the run has at most that many tokens)."""
    m, width = cfg.model, cfg.model.n_embd
    params = (cfg.tokenizer.vocab_size * width              # token embedding, tied with the output head
              + m.block_size * width                        # position embedding
              + m.n_layer * (12 * width * width + 2 * width)  # per block: qkv 3, proj 1, mlp 8 (x width²); 2 LayerNorms
              + width)                                      # final LayerNorm
    tensors = 3 + 6 * m.n_layer
    ranks = cfg.compute.nodes * cfg.compute.procs_per_node
    return 3 * FP32 * params + tensors * PER_TENSOR_BYTES + ranks * RNG_BYTES + EXTRA_BYTES


def free_bytes(folder: Path) -> int:
    """Bytes a non-root writer may still use where ``folder`` is, or will be once created."""
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    st = os.statvfs(existing)
    return st.f_bavail * st.f_frsize


def _bytes_under(folder: Path) -> int:
    """Bytes of the files under ``folder`` (0 when absent); a file pruned while counted counts 0."""
    total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(parent, name)).st_size
    return total


def _size(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB ({n:,} bytes)"


def check_free(folder: Path, need_bytes: int, what: str) -> None:
    """Raise ``DiskFull`` naming the folder, the bytes ``what`` needs and those free."""
    free = free_bytes(folder)
    if free < need_bytes:
        raise DiskFull(f"not enough free disk in {folder}: {what} needs {_size(need_bytes)}, only {_size(free)} "
                       "is free; free space there or put the run on a larger disk")


def check_training_room(cfg: RunConfig, checkpoints: Path) -> None:
    """Room for the checkpoints a run holds at its peak (``checkpoint.keep_last_n`` kept plus the one
    being written), less what its checkpoints folder already holds: a relaunch resumes from those."""
    each, keep = checkpoint_bytes(cfg), cfg.checkpoint.keep_last_n
    held = _bytes_under(checkpoints)
    need = max(each, (keep + 1) * each - held)
    check_free(checkpoints, need, f"training ({keep + 1} checkpoints of ~{_size(each)}: checkpoint.keep_last_n={keep} "
                                  f"kept + 1 being written, less {_size(held)} already there; a lower "
                                  "checkpoint.keep_last_n needs less)")
