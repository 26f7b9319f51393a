"""Process group, device and data parallelism (DDP or FSDP2) behind a few small functions.

``train.parallel: ddp`` replicates the model on every rank; ``fsdp`` shards parameters, gradients
and optimizer state with ``torch.distributed.fsdp.fully_shard`` (one unit per transformer block
plus the root) for models that do not fit one device. Checkpoints are sharded either way
(``trainer/shards.py``): each rank writes its part, and the library reshards on load, so a
checkpoint does not depend on the world size or on the parallelism it was written with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import StartupCheckFailed, arch


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str | None           # None: a single process, no process group
    rendezvous_s: float = 0.0


def setup(backend: str, timeout_s: float = 600.0) -> Dist:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if backend == "nccl" and not torch.cuda.is_available():
        raise StartupCheckFailed("startup checks failed: compute.backend is nccl but no CUDA device is visible "
                                 f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
    cuda = torch.cuda.is_available() and backend != "gloo"
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda and local_rank < torch.cuda.device_count():
        torch.cuda.set_device(device)
    if world == 1:
        return Dist(rank, world, local_rank, device, None)
    chosen = backend if backend != "auto" else ("nccl" if cuda else "gloo")
    started = time.monotonic()
    dist.init_process_group(backend=chosen, timeout=timedelta(seconds=timeout_s))
    return Dist(rank, world, local_rank, device, chosen, time.monotonic() - started)


def wrap(model: nn.Module, kind: str, ctx: Dist, bf16: bool) -> nn.Module:
    """The module the loop calls: ``model`` itself (one process, or FSDP, which shards in place) or DDP."""
    if kind == "fsdp":
        # ~0.6 s: FSDP runs only, not the trainer's start-up
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
        kwargs: dict[str, Any] = {"mp_policy": policy} if policy else {}
        for block in arch.layers(model):
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
        return model
    if ctx.world == 1:
        return model
    return DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)


@contextmanager
def grad_sync(wrapped: nn.Module, kind: str, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on all but the last micro-batch of a step."""
    if kind == "fsdp":
        wrapped.set_requires_gradient_sync(sync)
        yield
        return
    with (nullcontext() if sync or not hasattr(wrapped, "no_sync") else wrapped.no_sync()):
        yield


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Total gradient norm over all ranks (clipped to ``max_norm`` when it is > 0)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else float("inf"))
    from torch.distributed.tensor import DTensor  # ~0.5 s: the trainer's start-up must not pay for it

    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor  # ~0.5 s: the trainer's start-up must not pay for it

    return t.to_local() if isinstance(t, DTensor) else t


def local_numel(model: nn.Module) -> int:
    """Parameter elements this rank holds (FSDP: its shards only)."""
    return sum(_local(p).numel() for p in model.parameters())
