"""Checkpoints that are either complete and verified or ignored.

Layout (format 3): ``step-NNNNNNNN/`` holds the sharded state that ``torch.distributed.checkpoint``
writes, every rank its own part (``__<rank>_<n>.distcp``, and ``.metadata``, the index rank 0 writes
once every part is on disk: the model state and the optimizer state keyed by parameter name, as
``get_state_dict`` gives them), ``rng-rank<R>.pt`` (every rank), ``meta.json`` (global step, tokens
seen, sampler position, LR schedule, config sha256, parent, world size) and ``checksums.json``,
written last, into ``step-NNNNNNNN.inprogress/`` and then renamed (after OLMo-core). Every rank
hashes the files it wrote (``sums-rank<R>.json``); rank 0 folds them into ``checksums.json``. Valid
= renamed and every checksum matches. Resume takes the newest valid one, on any world size and
either parallelism (the library reshards on load). Format 2 (``model.pt`` + ``optim.pt``, the full
state written by rank 0) is still read. A checkpoint the disk cannot hold is refused before it is
written (``ensure_room``), and a disk that fills during a write removes the folder being written:
either way the run fails ``DiskFull`` with no torn folder left. docs/trainer.md has the full contract.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer import DiskFull, TrainerError
from trainer.fsio import sha256_file, write_json

log = logging.getLogger("trainer.checkpoint")
_NAME = re.compile(r"^step-(\d{8})$")
FORMAT = 3  # meta.json "format"; 3 = sharded (torch.distributed.checkpoint)
FULL_FORMAT = 2  # the full state in model.pt + optim.pt, written by rank 0 (still read); 1 is refused
SHARD_INDEX = ".metadata"  # what torch.distributed.checkpoint names its index
INPROGRESS = ".inprogress"
# room a checkpoint needs beyond its tensors' bytes: the per-tensor record of the shard files and
# their index (~400 bytes measured), 1% for the filesystem's own blocks, and meta.json,
# checksums.json and every file's partly used last block
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
    _save_durably(rng_state(), tmp / f"rng-rank{rank}.pt")


def clear_torn(root: Path) -> list[Path]:
    """Remove in-progress folders left by a killed run (none is being written at startup)."""
    torn = sorted(root.glob(f"step-*{INPROGRESS}")) if root.is_dir() else []
    for path in torn:
        shutil.rmtree(path, ignore_errors=True)
    return torn


def clear_step(root: Path, step: int) -> None:
    """Remove the in-progress folder of a checkpoint that will not be written."""
    shutil.rmtree(inprogress_dir(root, step), ignore_errors=True)


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.1f} MiB)"


def free_bytes(folder: Path) -> int:
    """Bytes a non-root writer may still use on ``folder``'s filesystem (one statvfs)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


def ensure_room(root: Path, step: int, tensor_bytes: int, tensors: int) -> None:
    """Refuse checkpoint ``step`` before any of it is written when the disk cannot hold it: found
    mid-write, a full disk costs a torn folder and a crash. The caller removes the RNG files the ranks
    already wrote into its in-progress folder (``clear_step``) once every rank has written its own."""
    need = tensor_bytes + tensors * PER_TENSOR_BYTES + tensor_bytes // 100 + SLACK_BYTES
    free = free_bytes(root)
    if free < need:
        raise DiskFull(f"not enough free disk for checkpoint {step_dir(root, step).name} in {root}: it needs "
                       f"{_size(need)}, {_size(free)} are free; the newest valid checkpoint stands: free space "
                       "there (or lower checkpoint.keep_last_n) and resume")


def disk_full(exc: BaseException | None) -> bool:
    """ENOSPC anywhere in the chain, or on any rank of a sharded write (which reports every rank's
    failure in one ``CheckpointException``)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        if any(disk_full(failure) for failure, *_ in getattr(exc, "failures", {}).values()):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def filled(root: Path, step: int) -> DiskFull:
    """The error of a checkpoint the disk filled during (the caller removes its folder: rank 0)."""
    tmp = inprogress_dir(root, step)
    return DiskFull(f"the disk filled while checkpoint {tmp.name} was written in {root} "
                    f"({_size(free_bytes(root))} free once it was removed); the newest valid checkpoint stands: "
                    "free space there (or lower checkpoint.keep_last_n) and resume")


def _save_durably(obj: Any, path: Path) -> None:
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def rank_sums_name(rank: int) -> str:
    return f"sums-rank{rank}.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(root: Path, step: int, meta: dict, world: int, keep_last_n: int,
           pinned: frozenset[int] = frozenset()) -> Path:
    """Rank 0, once every rank's shards and RNG file are in the in-progress folder: meta.json,
    checksums last (every rank's own sums folded in), atomic rename, pruning.

    Runs in the background writer thread."""
    tmp = inprogress_dir(root, step)
    try:
        sums: dict[str, str] = {}
        for rank in range(world):
            part = tmp / rank_sums_name(rank)
            sums.update(json.loads(part.read_text()))
            part.unlink()
        write_json(tmp / "meta.json", meta)
        for p in sorted(tmp.iterdir()):
            if p.is_file() and p.name not in sums and (p.name == SHARD_INDEX or not p.name.startswith(".")):
                sums[p.name] = sha256_file(p)
        write_json(tmp / "checksums.json", dict(sorted(sums.items())))
    except Exception as exc:
        if not disk_full(exc):
            raise
        clear_step(root, step)
        raise filled(root, step) from exc
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
    needed = ("meta.json", SHARD_INDEX) if SHARD_INDEX in sums else ("meta.json", "model.pt", "optim.pt")
    for name in needed:
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


def read_meta(path: Path) -> dict[str, Any]:
    """``meta.json`` of a checkpoint this trainer reads (format 3, or the full format 2)."""
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") not in (FORMAT, FULL_FORMAT):
        raise TrainerError(f"{path}/meta.json: checkpoint format {meta.get('format', 1)}, this trainer reads formats "
                           f"{FULL_FORMAT} and {FORMAT} (optimizer state keyed by parameter name, LR schedule anchor); "
                           "resume it with the trainer version that wrote it, or move the folder away to start over")
    return meta


def is_sharded(path: Path) -> bool:
    return (path / SHARD_INDEX).is_file()


def read_full_format(path: Path) -> dict[str, Any]:
    """Format 2's full model and optimizer state, every tensor on the CPU."""
    return {"model": torch.load(path / "model.pt", map_location="cpu", weights_only=True),
            "optim": torch.load(path / "optim.pt", map_location="cpu", weights_only=True)}


def read_rng(path: Path, rank: int) -> dict[str, Any] | None:
    """This rank's generators as saved, or None (a rank the writing world did not have)."""
    rng_file = path / f"rng-rank{rank}.pt"
    return _rng(rng_file) if rng_file.exists() else None


def _rng(path: Path) -> dict[str, Any] | None:
    """A rank's RNG state, read weights-only; one written before (a numpy array pickled whole) is not
    read: the run resumes with fresh generators, as when a rank's file is missing."""
    try:
        return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        log.warning("%s: written by an older trainer (pickled numpy state); resuming with fresh generators", path)
        return None
