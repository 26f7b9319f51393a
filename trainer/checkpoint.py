"""Checkpoints that are either complete and verified or ignored.

Layout: ``step-NNNNNNNN/`` with ``model.pt`` (full model state), ``optim.pt`` (full optimizer
state keyed by parameter name), ``rng-rank<R>.pt`` (every rank), ``meta.json`` (global step,
tokens seen, sampler position, LR schedule, grad-scaler state, config sha256, parent) and
``checksums.json``, written last, into ``step-NNNNNNNN.inprogress/`` and then renamed (after
OLMo-core). Valid = renamed and every checksum matches. Resume takes the newest valid one.
A checkpoint the disk cannot hold is refused before it is written (``ensure_room``), and a disk
that fills during a write removes the folder being written: either way the run fails ``DiskFull``
with no torn folder left. docs/trainer.md has the full contract.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import DiskFull, TrainerError
from trainer.fsio import sha256_file, write_json

log = logging.getLogger("trainer.checkpoint")
_NAME = re.compile(r"^step-(\d{8})$")
FORMAT = 2  # meta.json "format"; 1 = before optimizer state keyed by name and the schedule anchor
INPROGRESS = ".inprogress"
# room a checkpoint needs beyond its tensors' bytes: torch.save's zip record and pickle per tensor
# (~400 bytes measured), 1% for the filesystem's own blocks, and meta.json, checksums.json and
# every file's partly used last block
PER_TENSOR_BYTES, SLACK_BYTES = 512, 64 << 10


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def inprogress_dir(root: Path, step: int) -> Path:
    return step_dir(root, step).with_suffix(INPROGRESS)


def rng_state() -> dict[str, Any]:
    """Every generator's state in what ``torch.load(weights_only=True)`` reads back (tensors, numbers,
    tuples): a checkpoint may come from elsewhere (a parent downloaded from MLflow), and a pickle runs
    code as it loads."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_rank_state(root: Path, step: int, rank: int) -> None:
    """Every rank saves its own RNG state into the in-progress folder (small; synchronous)."""
    tmp = inprogress_dir(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    _save_hashed(rng_state(), tmp / f"rng-rank{rank}.pt", lambda n: None)


def clear_torn(root: Path) -> list[Path]:
    """Remove in-progress folders left by a killed run (none is being written at startup)."""
    torn = sorted(root.glob(f"step-*{INPROGRESS}")) if root.is_dir() else []
    for path in torn:
        shutil.rmtree(path, ignore_errors=True)
    return torn


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.1f} MiB)"


def free_bytes(folder: Path) -> int:
    """Bytes a non-root writer may still use on ``folder``'s filesystem (one statvfs)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def ensure_room(root: Path, step: int, tensor_bytes: int, tensors: int) -> None:
    """Refuse checkpoint ``step`` before any of it is written when the disk cannot hold it: found
    mid-write, a full disk costs a torn folder and a crash. The RNG files the ranks already wrote
    into its in-progress folder are removed with it."""
    need = tensor_bytes + tensors * PER_TENSOR_BYTES + tensor_bytes // 100 + SLACK_BYTES
    free = free_bytes(root)
    if free < need:
        shutil.rmtree(inprogress_dir(root, step), ignore_errors=True)
        raise DiskFull(f"not enough free disk for checkpoint {step_dir(root, step).name} in {root}: it needs "
                       f"{_size(need)}, {_size(free)} are free; the newest valid checkpoint stands: free space "
                       "there (or lower checkpoint.keep_last_n) and resume")


def _disk_full(exc: BaseException | None) -> bool:
    """ENOSPC anywhere in the chain: torch.save reports a failed write as its own RuntimeError."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class _HashingWriter:
    """File wrapper that hashes and counts what ``torch.save`` writes: one pass, no re-read."""

    def __init__(self, fh: Any, progress: Callable[[int], None]) -> None:
        self.fh, self.progress, self.digest = fh, progress, hashlib.sha256()

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.progress(len(memoryview(data)))
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _save_hashed(obj: Any, path: Path, progress: Callable[[int], None]) -> str:
    with open(path, "wb") as fh:
        writer = _HashingWriter(fh, progress)
        torch.save(obj, writer)
        fh.flush()
        os.fsync(fh.fileno())
    return writer.digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(root: Path, step: int, model_state: dict, optim_state: dict, meta: dict, keep_last_n: int,
           progress: Callable[[int], None] = lambda n: None,
           after_model: Callable[[], None] = lambda: None, pinned: frozenset[int] = frozenset()) -> Path:
    """Rank 0, after every rank wrote its RNG file: shared state, checksums last, atomic rename.

    Runs in the background writer thread; ``progress`` is told every chunk written.
    """
    tmp = inprogress_dir(root, step)
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        sums = {"model.pt": _save_hashed(model_state, tmp / "model.pt", progress)}
        after_model()
        sums["optim.pt"] = _save_hashed(optim_state, tmp / "optim.pt", progress)
        write_json(tmp / "meta.json", meta)
        for p in sorted(tmp.iterdir()):
            if p.is_file() and p.name not in sums and not p.name.startswith("."):
                sums[p.name] = sha256_file(p)
        write_json(tmp / "checksums.json", dict(sorted(sums.items())))
    except Exception as exc:
        if not _disk_full(exc):
            raise
        shutil.rmtree(tmp, ignore_errors=True)
        raise DiskFull(f"the disk filled while checkpoint {tmp.name} was written in {root} "
                       f"({_size(free_bytes(root))} free once it was removed); the newest valid checkpoint stands: "
                       "free space there (or lower checkpoint.keep_last_n) and resume") from exc
    final = step_dir(root, step)
    if final.exists():  # a resumed run re-saving a step whose old copy was found invalid
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _prune(root, keep_last_n, pinned)
    return final


def _prune(root: Path, keep_last_n: int, pinned: frozenset[int] = frozenset()) -> None:
    """Keep the newest ``keep_last_n`` and the ``pinned`` steps (not counted among them)."""
    prunable = [p for p in sorted(_complete(root)) if int(_NAME.match(p.name)[1]) not in pinned]
    for old in prunable[:-keep_last_n]:
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
    for name in ("model.pt", "optim.pt", "meta.json"):
        if name not in sums:
            return False, f"checksums.json does not list {name}"
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


def at_step(root: Path, step: int) -> Path | None:
    """The valid checkpoint of global step ``step`` (e.g. the one a model was exported from), or None."""
    path = step_dir(root, step)
    return path if path.is_dir() and is_valid(path)[0] else None


def load(path: Path, rank: int) -> dict[str, Any]:
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise TrainerError(f"{path}/meta.json: checkpoint format {meta.get('format', 1)}, this trainer reads format "
                           f"{FORMAT} (optimizer state keyed by parameter name, LR schedule anchor); resume it with "
                           "the trainer version that wrote it, or move the folder away to start over")
    rng_file = path / f"rng-rank{rank}.pt"
    return {
        "meta": meta,
        "model": torch.load(path / "model.pt", map_location="cpu", weights_only=True),
        "optim": torch.load(path / "optim.pt", map_location="cpu", weights_only=True),
        "rng": _rng(rng_file) if rng_file.exists() else None,
    }


def _rng(path: Path) -> dict[str, Any] | None:
    """A rank's RNG state, read weights-only; one written before (a numpy array pickled whole) is not
    read: the run resumes with fresh generators, as when a rank's file is missing."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        log.warning("%s: written by an older trainer (pickled numpy state); resuming with fresh generators", path)
        return None
