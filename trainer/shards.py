"""The sharded state of a checkpoint through ``torch.distributed.checkpoint`` (DCP): every rank
writes and reads only its own part, so no rank ever holds the whole model and optimizer state.

``state`` is what ``get_state_dict`` gives (FSDP: each rank's shards as DTensors; DDP: the replica,
which DCP spreads over the ranks so each tensor is written once). Loading reshards: a checkpoint
written by 2 ranks under FSDP loads into 3 ranks under DDP, or one process. ``torch.distributed``
is imported here only, by the trainer's processes (never by the pipelines that read run folders).
"""

from __future__ import annotations

import shutil
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from trainer import checkpoint
from trainer.fsio import sha256_file, write_json

# one process saves and loads alone on purpose (no process group): DCP warns on every call otherwise
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")


class _HashingWriter(dcp.FileSystemWriter):
    """DCP's file writer that, once this rank's files are on disk, hashes them into
    ``sums-rank<R>.json``: each rank hashes only what it wrote, before rank 0 writes the index, so
    rank 0 never reads another rank's shards to checksum the checkpoint."""

    def __init__(self, folder: Path, rank: int) -> None:
        super().__init__(str(folder), single_file_per_rank=True, sync_files=True, overwrite=True)
        self.folder, self.rank = folder, rank

    def write_data(self, plan: Any, planner: Any) -> Future:
        written = super().write_data(plan, planner)
        names = sorted({result.storage_data.relative_path for result in written.wait()})
        write_json(self.folder / checkpoint.rank_sums_name(self.rank), {n: sha256_file(self.folder / n) for n in names})
        return written


def group() -> Any:
    """The process group the background writers save over (gloo: DCP's save coordinates on the CPU).
    Training's own collectives stay on the default group, on the main thread: two threads never
    share one group's order. None for one process. A collective: every rank calls it, once."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    """The live state this rank holds (FSDP: its shards), keyed by parameter name; a tied weight
    (the output head that is the token embedding) once, under its first name: DCP keys by name and
    would write it twice."""
    model_state, optim_state = get_state_dict(model, optim)
    return {"model": _once(model_state), "optim": optim_state}


def _once(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with each tensor under its first name only (tied weights share one storage)."""
    seen: set[int] = set()
    once = {}
    for name, t in state.items():
        local = t.to_local() if hasattr(t, "to_local") else t
        if (ptr := local.untyped_storage().data_ptr()) not in seen:
            seen.add(ptr)
            once[name] = t
    return once


def write(state: dict[str, Any], folder: Path, rank: int, pg: Any) -> None:
    """This rank's part of ``state`` into ``folder`` (a collective over ``pg``; rank 0 writes the
    index once every rank's part is on disk). Runs in the background writer thread."""
    folder.mkdir(parents=True, exist_ok=True)
    dcp.save(state, storage_writer=_HashingWriter(folder, rank), process_group=pg, no_dist=pg is None)


def load(model: torch.nn.Module, optim: torch.optim.Optimizer, path: Path, kind: str) -> None:
    """Load a checkpoint of either format into ``model`` and ``optim`` (wrapped, on their device):
    format 3 reads only this rank's part, resharded to the present world; format 2's full state is
    read whole on every rank and each keeps its part (as before)."""
    if checkpoint.is_sharded(path):
        state = state_of(model, optim)
        if problems := _mismatch(path, state["model"]):
            raise ValueError("; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""))
        dcp.load(state, checkpoint_id=str(path), no_dist=not dist.is_initialized())
        # not strict: the tied names state_of leaves out are the same tensor as the one loaded
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=False))
        return
    full = checkpoint.read_full_format(path)
    options = StateDictOptions(full_state_dict=True) if kind == "fsdp" else StateDictOptions()
    set_state_dict(model, optim, model_state_dict=full["model"], optim_state_dict=full["optim"], options=options)



# what HuggingFaceStorageWriter names its one consolidated file (and the index beside it)
_CONSOLIDATED, _HF_INDEX, _HF_SHARDS = "model-00001-of-00001.safetensors", "model.safetensors.index.json", "sharded"


def _mismatch(path: Path, model_state: dict[str, Any]) -> list[str]:
    """How the checkpoint's model differs from ``model_state``'s (names and whole shapes, from DCP's
    index alone), one line per tensor: read before any data, so a changed model is refused by name."""
    saved = {k.removeprefix("model."): list(v.size) for k, v in
             dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata.items()
             if k.startswith("model.") and hasattr(v, "size")}
    here = {k: list(t.shape) for k, t in model_state.items()}
    problems = [f"{k} is {saved[k]} in the checkpoint, {shape} in this model" for k, shape in here.items()
                if k in saved and saved[k] != shape]
    problems += [f"{k} is not in the checkpoint" for k in here if k not in saved]
    return problems + [f"{k} is in the checkpoint, not in this model" for k in saved if k not in here]


def write_weights(model: torch.nn.Module, folder: Path) -> None:
    """The model's weights as ``folder/model.safetensors``, streamed: every rank writes its part
    (safetensors), then rank 0 copies every part into one file at its offset, tensor by tensor
    (DCP's ``HuggingFaceStorageWriter`` with consolidation); no rank gathers the model. A collective."""
    dcp.save(_once(get_model_state_dict(model)), no_dist=not dist.is_initialized(),
             storage_writer=HuggingFaceStorageWriter(str(folder), save_distributed=True, enable_consolidation=True))
    if not dist.is_initialized() or dist.get_rank() == 0:
        (folder / _CONSOLIDATED).rename(folder / "model.safetensors")
        (folder / _HF_INDEX).unlink()
        shutil.rmtree(folder / _HF_SHARDS)
