"""The training loop, readable top to bottom (after torchtitan's train.py).

setup distributed → build model → resume (newest valid checkpoint, else parent weights) →
step loop (accumulate, clip, step, log, checkpoint, honour SIGTERM) → export weights.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainer import checkpoint, weights
from trainer.data import PackedSplit, ShardedSampler
from trainer.model import GPT
from trainer.spec import TrainSpec
from trainer.status import StatusWriter

log = logging.getLogger("trainer")

EXIT_CANCELED = 143  # SIGTERM honoured: checkpoint saved, state ``canceled``


def lr_at(step: int, t: dict) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``min_lr`` at ``steps``."""
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    progress = min(1.0, (step - t["warmup_steps"]) / max(1, t["steps"] - t["warmup_steps"]))
    return t["min_lr"] + 0.5 * (1 + math.cos(math.pi * progress)) * (t["lr"] - t["min_lr"])


def _setup_distributed(spec: TrainSpec) -> tuple[int, int, torch.device]:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    cuda = torch.cuda.is_available() and spec.backend != "gloo"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group(backend=spec.backend if spec.backend != "auto" else ("nccl" if cuda else "gloo"))
    return rank, world, device


def _optimizer(model: torch.nn.Module, t: dict) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t["lr"], betas=(0.9, 0.95), eps=1e-8)


class _Termination:
    """SIGTERM sets a flag; the loop finishes its step, checkpoints and exits ``EXIT_CANCELED``."""

    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def agreed(self, world: int) -> bool:
        if world == 1:
            return self.requested
        flag = torch.tensor([1.0 if self.requested else 0.0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def train(spec: TrainSpec) -> int:
    t = spec.train
    torch.set_num_threads(spec.threads)
    if t.get("deterministic"):
        torch.use_deterministic_algorithms(True)
    rank, world, device = _setup_distributed(spec)
    status = StatusWriter(spec.run_dir, t["steps"], enabled=rank == 0)
    status.update(state="initializing", force=True)
    term = _Termination()
    try:
        code = _run(spec, t, rank, world, device, status, term)
    except Exception as exc:
        status.update(state="failed", error=f"{type(exc).__name__}: {exc}", force=True)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return code


def _run(spec: TrainSpec, t: dict, rank: int, world: int, device: torch.device,
         status: StatusWriter, term: _Termination) -> int:
    torch.manual_seed(t["seed"])
    np.random.seed(t["seed"] + rank)
    model = GPT(spec.model).to(device)
    data = PackedSplit(spec.data, "train")
    sampler = ShardedSampler(len(data), t["batch_size"], rank, world, t["seed"])
    optim = _optimizer(model, t)
    step, tokens_seen = 0, 0

    resume = checkpoint.latest_valid(spec.checkpoints)
    if resume is not None:
        state = checkpoint.load(resume, rank)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        sampler.load_state_dict(state["meta"]["sampler"])
        step, tokens_seen = state["meta"]["global_step"], state["meta"]["tokens_seen"]
        if state["rng"] is not None:
            checkpoint.set_rng_state(state["rng"])
        log.info("resumed from %s at step %d", resume, step)
        status.update(last_checkpoint=str(resume))
    elif spec.parent:
        parent, _ = weights.load(spec.parent["weights"])
        model.load_state_dict(parent.state_dict())
        log.info("initialised weights from parent %s", spec.parent.get("uri"))

    ddp = DDP(model) if world > 1 else model
    tokens_per_step = t["batch_size"] * t["grad_accum"] * data.seq_len * world
    status.update(state="running", step=step, tokens_seen=tokens_seen, force=True)
    window_start, window_tokens = time.perf_counter(), 0

    while step < t["steps"]:
        lr = lr_at(step, t)
        for group in optim.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(t["grad_accum"]):
            x, y, d = (torch.from_numpy(a).to(device) for a in data.batch(sampler.next_indices()))
            sync = micro == t["grad_accum"] - 1 or world == 1
            with (nullcontext() if sync else ddp.no_sync()):
                _, loss = ddp(x, y, d)
                (loss / t["grad_accum"]).backward()
            loss_sum += loss.detach()
        grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
                     if t["grad_clip"] > 0 else torch.zeros(()))
        optim.step()
        optim.zero_grad(set_to_none=True)
        step += 1
        tokens_seen += tokens_per_step
        window_tokens += tokens_per_step

        last = step == t["steps"]
        if step % t["log_every"] == 0 or last:
            mean_loss = loss_sum / t["grad_accum"]
            if world > 1:
                dist.all_reduce(mean_loss, op=dist.ReduceOp.AVG)
            elapsed = time.perf_counter() - window_start
            tps = window_tokens / max(elapsed, 1e-9)
            record = {"step": step, "loss": round(mean_loss.item(), 5), "lr": lr,
                      "grad_norm": round(float(grad_norm), 5), "tokens_seen": tokens_seen,
                      "tokens_per_s": round(tps, 1)}
            status.log_metrics(record)
            status.update(step=step, loss=record["loss"], tokens_seen=tokens_seen, tokens_per_s=record["tokens_per_s"])
            if not math.isfinite(record["loss"]):
                raise FloatingPointError(f"loss is {record['loss']} at step {step}")
            window_start, window_tokens = time.perf_counter(), 0
        else:
            status.update(step=step, tokens_seen=tokens_seen)

        stop = term.agreed(world)
        if step % spec.checkpoint["every_steps"] == 0 or last or stop:
            _save(spec, model, optim, sampler, step, tokens_seen, rank, world, status)
        if stop:
            status.update(state="canceled", force=True)
            return EXIT_CANCELED

    if rank == 0:
        weights.export(model, spec.export_dir, {"global_step": step, "tokens_seen": tokens_seen,
                                                "config_sha256": spec.config_sha256})
    if world > 1:
        dist.barrier()
    status.update(state="succeeded", step=step, force=True)
    return 0


def _save(spec: TrainSpec, model: GPT, optim: torch.optim.Optimizer, sampler: ShardedSampler,
          step: int, tokens_seen: int, rank: int, world: int, status: StatusWriter) -> None:
    status.update(state="checkpointing", force=True)
    checkpoint.write_rank_state(spec.checkpoints, step, rank)
    if world > 1:
        dist.barrier()
    if rank == 0:
        meta = {"global_step": step, "tokens_seen": tokens_seen, "sampler": sampler.state_dict(),
                "config_sha256": spec.config_sha256, "parent": (spec.parent or {}).get("uri"),
                "world_size": world}
        path = checkpoint.finalize(spec.checkpoints, step, model.state_dict(), optim.state_dict(), meta,
                                   spec.checkpoint["keep_last_n"])
        status.update(last_checkpoint=str(Path(path)))
    if world > 1:
        dist.barrier()
    status.update(state="running", force=True)
