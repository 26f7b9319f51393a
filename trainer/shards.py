"""The sharded state of a checkpoint through ``torch.distributed.checkpoint`` (DCP): every rank
writes and reads only its own part, so no rank ever holds the whole model and optimizer state.

``state`` is what ``get_state_dict`` gives (FSDP: each rank's shards as DTensors; DDP: the replica,
which DCP spreads over the ranks so each tensor is written once). Loading reshards: a checkpoint
written by 2 ranks under FSDP loads into 3 ranks under DDP, or one process. ``torch.distributed``
is imported here only, by the trainer's processes (never by the pipelines that read run folders).
"""

from __future__ import annotations

import pickle
import shutil
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

from trainer import DiskFull, TrainerError, checkpoint
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


class _IndexOnly(pickle.Unpickler):
    """Unpickles DCP's index with only the classes an index is made of: a checkpoint may come from
    elsewhere (a parent downloaded from MLflow), and a plain unpickle runs whatever the file names.
    (The tensors themselves DCP reads with ``torch.load(weights_only=True)``.)"""

    ALLOWED = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("pathlib", "PosixPath"),
               ("torch", "Size"), ("torch.serialization", "_get_layout"), ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str) -> Any:
        if (module == "torch.distributed.checkpoint.metadata" or (module, name) in self.ALLOWED
                or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which no checkpoint index holds")


class SafeReader(dcp.FileSystemReader):
    """DCP's file reader, its index read by ``_IndexOnly`` (the rest as DCP reads it)."""

    def read_metadata(self) -> Metadata:
        """The index every rank shares (no keyword ``rank``: DCP would then fall back to per-rank indexes
        when this one is refused)."""
        path = self._get_metadata_path()
        try:
            with self.fs.create_stream(path, "rb") as fh:
                metadata = _IndexOnly(fh).load()
        except pickle.UnpicklingError as exc:
            raise TrainerError(f"{path}: refused unread: {exc}") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def failed(exc: BaseException) -> str:
    """What went wrong on each rank of a DCP call, one line each (its ``CheckpointException`` prints
    every rank's traceback)."""
    failures = getattr(exc, "failures", None)
    if not failures:
        return f"{type(exc).__name__}: {exc}"
    return "; ".join(f"rank {rank}: {type(e).__name__}: {e}" for rank, (e, *_) in sorted(failures.items()))


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
    return {"model": _once(model, model_state), "optim": optim_state}


def _aliases(model: torch.nn.Module) -> dict[str, str]:
    """Each later name of a tied parameter → its first name (the same Parameter object)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in first:
            aliases[name] = first[id(param)]
        else:
            first[id(param)] = name
    return aliases


def _once(model: torch.nn.Module, state: dict[str, Any]) -> dict[str, Any]:
    aliases = _aliases(model)
    return {k: v for k, v in state.items() if k not in aliases}


def write(state: dict[str, Any], folder: Path, rank: int, pg: Any) -> None:
    """This rank's part of ``state`` into ``folder`` (a collective over ``pg``; rank 0 writes the
    index once every rank's part is on disk). Runs in the background writer thread. A failure on any
    rank reaches every rank as DCP's ``CheckpointException`` (a ``BaseException``)."""
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
        dcp.load(state, storage_reader=SafeReader(str(path)), no_dist=not dist.is_initialized())
        for alias, first in _aliases(model).items():  # the tied names, saved once: the same tensor
            state["model"][alias] = state["model"][first]
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return
    full = checkpoint.read_full_format(path)
    options = StateDictOptions(full_state_dict=True) if kind == "fsdp" else StateDictOptions()
    set_state_dict(model, optim, model_state_dict=full["model"], optim_state_dict=full["optim"], options=options)



def read_whole(path: Path) -> dict[str, Any]:
    """Either format's state as one dict of whole tensors (``{"model": ..., "optim": ...}``), with no
    model to load it into and no process group: for tools and tests, which compare checkpoints.
    A training rank never calls this: it loads only its own part (``load``)."""
    if not checkpoint.is_sharded(path):
        return checkpoint.read_full_format(path)
    # as DCP's own format_utils.dcp_to_torch_save reads a whole checkpoint
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = SafeReader(str(path))
    reader.read_metadata()  # a refused index is refused here, not wrapped in DCP's exception
    state: dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


# what HuggingFaceStorageWriter names its one consolidated file (and the index beside it)
_CONSOLIDATED, _HF_INDEX, _HF_SHARDS = "model-00001-of-00001.safetensors", "model.safetensors.index.json", "sharded"


def _mismatch(path: Path, model_state: dict[str, Any]) -> list[str]:
    """How the checkpoint's model differs from ``model_state``'s (names and whole shapes, from DCP's
    index alone), one line per tensor: read before any data, so a changed model is refused by name."""
    saved = {k.removeprefix("model."): list(v.size) for k, v in
             SafeReader(str(path)).read_metadata().state_dict_metadata.items()
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
    try:
        dcp.save(_once(model, get_model_state_dict(model)), no_dist=not dist.is_initialized(),
                 storage_writer=HuggingFaceStorageWriter(str(folder), save_distributed=True, enable_consolidation=True))
    except BaseException as exc:  # DCP's CheckpointException: every rank's failure, as one BaseException
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        if checkpoint.disk_full(exc):
            raise DiskFull(f"the disk filled while the model was exported to {folder}: {failed(exc)}") from exc
        raise TrainerError(f"exporting the model to {folder} failed: {failed(exc)}") from exc
    if not dist.is_initialized() or dist.get_rank() == 0:
        (folder / _CONSOLIDATED).rename(folder / "model.safetensors")
        (folder / _HF_INDEX).unlink()
        shutil.rmtree(folder / _HF_SHARDS)
