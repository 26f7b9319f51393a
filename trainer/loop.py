"""The training loop, readable top to bottom (after torchtitan's train.py).

startup checks → build model → resume (newest valid checkpoint, else parent weights) → step loop
(accumulate, clip, skip or step while one small health all-reduce runs, log, checkpoint asynchronously, honour
SIGTERM) → wait for the last checkpoint → export weights.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import signal
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from trainer import EXIT_CANCELED, EXIT_DATA_STALL, TrainerError, arch, checkpoint, parallel, shards, startup, weights
from trainer.data import PackedSplit, ShardedSampler
from trainer.events import Events
from trainer.faults import Faults
from trainer.health import DataWatchdog, LocalTimer, NonFiniteGuard, SpikeDetector, StragglerDetector
from trainer.hooks import Hooks
from trainer.parallel import Dist
from trainer.saver import Committed, Saver
from trainer.schedule import Schedule
from trainer.spec import TrainSettings, TrainSpec
from trainer.status import State, StatusWriter, record_failure
from trainer.throughput import flops_per_token, mfu, peak_flops

log = logging.getLogger("trainer")


def _optimizer(model: torch.nn.Module, t: TrainSettings) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(0.9, 0.95), eps=1e-8)


class _Termination:
    """SIGTERM sets a flag; the loop finishes its step, checkpoints and exits ``EXIT_CANCELED``.

    If that takes longer than ``grace_s`` (the launcher's SIGKILL is coming), the process
    records the cancel without a new checkpoint and exits ``EXIT_CANCELED`` itself.
    """

    def __init__(self, grace_s: float, on_timeout: Any) -> None:
        self.requested = False
        self.grace_s, self.on_timeout = grace_s, on_timeout
        self._timer: threading.Timer | None = None
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.requested:
            self.requested = True
            self._timer = threading.Timer(self.grace_s, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def _expire(self) -> None:
        try:
            self.on_timeout(f"SIGTERM grace period of {self.grace_s:g} s ran out before the checkpoint completed")
        finally:
            os._exit(EXIT_CANCELED)

    def restore(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        signal.signal(signal.SIGTERM, self._previous)


def train(spec: TrainSpec) -> int:
    """Run (or resume) one training job on this rank; returns the process exit code."""
    t = spec.train
    torch.set_num_threads(spec.threads)
    if t.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    rank = int(os.environ.get("RANK", 0))
    status = StatusWriter(spec.paths, t.steps, enabled=rank == 0, every_s=spec.status_every_s)
    status.update(state=State.INITIALIZING, force=True)
    events = Events(spec.paths.events, rank, to_file=rank == 0)

    def canceled_late(reason: str) -> None:
        status.update(state=State.CANCELED, error=reason, force=True)
        events.emit("canceled", logging.ERROR, reason=reason)

    term = _Termination(spec.cancel_grace_s, canceled_late)
    try:
        ctx = parallel.setup(spec.backend)
        if ctx.backend:
            events.emit("rendezvous_reached", backend=ctx.backend, world_size=ctx.world,
                        seconds=round(ctx.rendezvous_s, 3),
                        master=f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}")
        hooks = Hooks(Faults.from_env(spec.paths.scratch))
        startup.run(ctx, spec.world_size, events, hooks)
        return _Run(spec, ctx, status, events, term, hooks).run()
    except TrainerError as exc:
        status.update(state=State.FAILED, error=str(exc), force=True)
        events.emit("failed", logging.ERROR, error=str(exc), exit_code=exc.code)
        return exc.code
    except Exception as exc:
        status.update(state=State.FAILED, error=f"{type(exc).__name__}: {exc}", force=True)
        raise
    finally:
        term.restore()
        if dist.is_initialized():
            dist.destroy_process_group()


class _Run:
    """One attempt of one job on one rank: the state the loop carries between steps."""

    def __init__(self, spec: TrainSpec, ctx: Dist, status: StatusWriter, events: Events, term: _Termination,
                 hooks: Hooks) -> None:
        self.spec, self.ctx, self.status, self.events, self.term, self.hooks = spec, ctx, status, events, term, hooks
        self.t = spec.train
        self.kind = self.t.parallel if ctx.world > 1 else "ddp"  # one process: nothing to shard
        self.step = self.tokens_seen = 0
        self.parent_uri = spec.parent.uri if spec.parent else None
        self.saver = Saver(spec.checkpoints, spec.checkpoint.keep_last_n, spec.checkpoint.async_save,
                           device=ctx.device, rank=ctx.rank, world=ctx.world,
                           replicas=ctx.world if self.kind == "ddp" else 1,
                           after_state=hooks.after_state_written, heartbeat_every_s=spec.status_every_s)

    # --- setup ------------------------------------------------------------------------------

    def _resume_point(self) -> str | None:
        """Rank 0 removes torn folders and picks the newest valid checkpoint; every rank uses it."""
        choice: list[Any] = [None]
        if self.ctx.rank == 0:
            for torn in checkpoint.clear_torn(self.spec.checkpoints):
                self.events.emit("torn_checkpoint_removed", logging.WARNING, path=str(torn))
            newest = checkpoint.latest_valid(self.spec.checkpoints)
            choice = [str(newest) if newest else None]
        if self.ctx.world > 1:
            dist.broadcast_object_list(choice, src=0)
        return choice[0]

    def _build(self) -> None:
        spec, t, ctx = self.spec, self.t, self.ctx
        torch.manual_seed(t.seed)
        np.random.seed(t.seed + ctx.rank)
        random.seed(t.seed + ctx.rank)
        self.model = arch.build(spec.model)
        self.data = PackedSplit(spec.data, "train")
        self.sampler = ShardedSampler(len(self.data), t.batch_size, ctx.rank, ctx.world, t.seed)
        origin, start_lr, source, rng = 0, None, None, None
        self.skipped_before = 0
        resume = self._resume_point()
        if resume is not None:
            source = Path(resume)
            meta = checkpoint.read_meta(source)
            rng = checkpoint.read_rng(source, ctx.rank)
            self.sampler.load_state_dict(meta["sampler"])
            self.step, self.tokens_seen = meta["global_step"], meta["tokens_seen"]
            origin, start_lr = meta["lr_schedule"]["origin_step"], meta["lr_schedule"]["start_lr"]
            self.parent_uri = meta.get("parent", self.parent_uri)
            self.skipped_before = meta.get("skipped_steps", 0)
            self.events.emit("resumed", path=resume, global_step=self.step, tokens_seen=self.tokens_seen,
                             rng_restored=rng is not None, written_by_world=meta.get("world_size"),
                             format=meta["format"])
            if meta["config_sha256"] != spec.config_sha256:
                self.events.emit("config_changed", logging.WARNING, checkpoint_sha256=meta["config_sha256"],
                                 config_sha256=spec.config_sha256)
            self.status.update(last_checkpoint=resume)
        elif spec.parent:
            origin, start_lr, source = self._load_parent()
        self.model.to(ctx.device)
        precision = t.precision
        self.bf16 = precision == "bf16" or (precision == "auto" and ctx.device.type == "cuda")
        self.wrapped = parallel.wrap(self.model, self.kind, ctx, self.bf16)
        self.optim = _optimizer(self.model, t)
        if source is not None:
            self._load_state(source, parent=resume is None)
        if rng is not None:
            checkpoint.set_rng_state(rng)
        self.schedule = Schedule.from_config(t, origin, start_lr, spec.schedule)
        stable = self.schedule.stable_step
        # wsd: the pre-decay state is what the next refresh continues; pruning never takes it
        self.saver.pinned = frozenset({stable}) if stable is not None and stable > origin else frozenset()

    def _load_state(self, path: Path, parent: bool) -> None:
        """Model and optimizer state from a checkpoint (this rank's part of it), into the wrapped model."""
        try:
            shards.load(self.model, self.optim, path, self.kind)
        except (RuntimeError, ValueError, KeyError, CheckpointException) as exc:  # DCP's names every rank's failure
            what = f"parent {self.parent_uri} ({path})" if parent else f"checkpoint {path}"
            hint = "" if parent else (" (the model section changed since it was written: restore it, or move the "
                                      "run's checkpoints away to start over)")
            raise TrainerError(f"{what} does not fit the configured model{hint}: {exc}") from None

    def _load_parent(self) -> tuple[int, float | None, Path | None]:
        """Weights from the parent (and, when its full checkpoint was kept, model and optimizer state
        from that, loaded once the model is wrapped); global step, tokens seen and the LR continue from
        the state loaded: the full checkpoint's metadata (with a wsd schedule, the parent's stable
        state), else the exported weights'."""
        parent, info = weights.load(self.spec.parent.weights)
        full = self.spec.parent.checkpoint
        if full is not None:
            meta = checkpoint.read_meta(Path(full))
            gs = int(meta["global_step"])
            info = {"global_step": gs, "tokens_seen": meta["tokens_seen"],
                    "final_lr": Schedule.from_dict(meta["lr_schedule"]).lr(gs - 1)}
        else:
            try:
                self.model.load_state_dict(parent.state_dict())
            except RuntimeError as exc:
                raise TrainerError(f"parent {self.parent_uri} ({self.spec.parent.weights}) does not fit the "
                                   f"configured model: {exc}") from None
        self.step = self.tokens_seen = 0
        if "global_step" in info:
            self.step, self.tokens_seen = int(info["global_step"]), int(info.get("tokens_seen", 0))
        else:
            self.events.emit("parent_without_training_metadata", logging.WARNING, uri=self.parent_uri)
        start_lr = info.get("final_lr")
        self.events.emit("parent_loaded", uri=self.parent_uri, global_step=self.step, tokens_seen=self.tokens_seen,
                         start_lr=start_lr, optimizer_state=str(full) if full else None)
        return self.step, start_lr, Path(full) if full is not None else None

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> int:
        spec, t, ctx = self.spec, self.t, self.ctx
        self._build()
        watchdog = DataWatchdog(t.data_timeout_s, spec.paths.scratch / f"stacks-rank{ctx.rank}.txt",
                                lambda reason: record_failure(spec.paths.status, f"rank {ctx.rank}: {reason}"),
                                EXIT_DATA_STALL)
        try:
            return self._loop(watchdog)
        finally:
            watchdog.close()
            try:
                self.saver.wait()  # a checkpoint already requested completes even when the loop failed
            except Exception:
                log.exception("checkpoint write failed")
            self.saver.close()

    def _loop(self, watchdog: DataWatchdog) -> int:
        spec, t, ctx, status, events = self.spec, self.t, self.ctx, self.status, self.events
        accum, world, device = t.grad_accum, ctx.world, ctx.device
        tokens_per_step = t.batch_size * accum * self.data.seq_len * world
        autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if self.bf16 else nullcontext
        guard = NonFiniteGuard(t.max_nonfinite_steps)
        guard.skipped = self.skipped_before
        spikes = SpikeDetector(t.spike_window, t.spike_sigma)
        stragglers = StragglerDetector(world)
        timer = LocalTimer(device)
        flops_token = flops_per_token(self.model, self.data.seq_len)
        peak = peak_flops(device, self.bf16, t.peak_tflops)
        end = self.schedule.end_step
        status.update(state=State.RUNNING, step=self.step, total_steps=end, tokens_seen=self.tokens_seen, force=True)
        events.emit("training_started", step=self.step, end_step=end, world_size=world, parallel=self.kind,
                    bf16=self.bf16, tokens_per_step=tokens_per_step, flops_per_token=flops_token,
                    parameters=self.model.num_params(non_embedding=False),
                    local_parameters=parallel.local_numel(self.model))
        window_start, window_tokens = time.perf_counter(), 0

        while self.step < end:
            step_started = time.perf_counter()
            lr = self.schedule.lr(self.step)
            for group in self.optim.param_groups:
                group["lr"] = lr
            timer.begin()
            loss_sum = torch.zeros((), device=device)
            for micro in range(accum):
                with watchdog.waiting(self.step + 1):
                    self.hooks.before_batch(ctx.rank, self.step + 1)
                    batch = self.data.batch(self.sampler.next_indices())
                x, y, d = (torch.from_numpy(a).to(device, non_blocking=True) for a in batch)
                last = micro == accum - 1
                with parallel.grad_sync(self.wrapped, self.kind, last):
                    with autocast():
                        _, loss = self.wrapped(x, y, d)
                    loss = self.hooks.loss_for_backward(self.step + 1, loss)
                    if last:
                        timer.mark()
                    (loss / accum).backward()
                loss_sum += loss.detach()
            loss_sum = self.hooks.loss_measured(self.step + 1, loss_sum)
            grad_norm = parallel.clip_grad_norm(self.model, t.grad_clip)

            # one collective per step, overlapped with the update: stop flag, loss, grad norm, each rank's time
            health = torch.zeros(3 + world, device=device)
            health[0] = float(self.term.requested)
            health[1] = loss_sum / accum
            health[2] = grad_norm
            health[3 + ctx.rank] = timer.seconds()
            pending = dist.all_reduce(health, async_op=True) if world > 1 else None
            # The gradients are already reduced, so this norm is identical on every rank and every rank
            # takes the same skip decision without waiting for the others; a NaN/Inf loss makes it NaN.
            finite = bool(torch.isfinite(grad_norm))
            if finite:
                self.optim.step()
            self.optim.zero_grad(set_to_none=True)
            if pending is not None:
                pending.wait()
            values = health.tolist()
            stop, loss_value, norm_value, rank_times = values[0] > 0, values[1] / world, values[2] / world, values[3:]
            if guard.observe(finite, self.step + 1):
                events.emit("nonfinite_step_skipped", logging.WARNING, step=self.step + 1, streak=guard.streak,
                            loss=_finite_or_none(loss_value), grad_norm=_finite_or_none(norm_value))
            elif (spike := spikes.observe(loss_value)) is not None:
                events.emit("loss_spike", logging.WARNING, step=self.step + 1, **spike)
            self.step += 1
            self.tokens_seen += tokens_per_step
            window_tokens += tokens_per_step
            if not self.saver.reserved:
                self.saver.reserve(shards.state_of(self.model, self.optim))
            self._note_slow_ranks(stragglers.observe(rank_times), rank_times)
            self.hooks.after_step(ctx.rank, self.step)
            self._drain()

            final = self.step == end
            if self.step % t.log_every == 0 or final:
                elapsed = time.perf_counter() - window_start
                tps = window_tokens / max(elapsed, 1e-9)
                util = mfu(flops_token, tps, peak, world)
                record = {"step": self.step, "loss": _finite_or_none(loss_value, 5), "lr": lr,
                          "grad_norm": _finite_or_none(norm_value, 5), "tokens_seen": self.tokens_seen,
                          "tokens_per_s": round(tps, 1), "mfu": None if util is None else round(util, 4),
                          "step_time_s": round(time.perf_counter() - step_started, 5),
                          "rank_step_time_s": [round(s, 5) for s in rank_times], "skipped_steps": guard.skipped,
                          "cpu_s": round(time.process_time(), 3)}
                status.log_metrics(record)
                status.update(step=self.step, loss=record["loss"], tokens_seen=self.tokens_seen,
                              tokens_per_s=record["tokens_per_s"], mfu=record["mfu"], skipped_steps=guard.skipped)
                window_start, window_tokens = time.perf_counter(), 0
            else:
                status.update(step=self.step, tokens_seen=self.tokens_seen, skipped_steps=guard.skipped)

            if self.step % spec.checkpoint.every_steps == 0 or final or stop or self.step == self.schedule.stable_step:
                if stop:
                    status.update(state=State.CANCELING, force=True)
                self._save(guard.skipped, wait=final or stop)
            if stop:
                status.update(state=State.CANCELED, force=True)
                events.emit("canceled", step=self.step, reason="SIGTERM")
                return EXIT_CANCELED

        self.saver.wait(self._heartbeat)
        self._drain()
        self._export()
        status.update(state=State.SUCCEEDED, step=self.step, force=True)
        events.emit("succeeded", step=self.step, tokens_seen=self.tokens_seen, skipped_steps=guard.skipped)
        return 0

    # --- pieces of a step -------------------------------------------------------------------

    def _heartbeat(self) -> None:
        self.status.update(force=True)

    def _note_slow_ranks(self, slow: list[int], times: list[float]) -> None:
        if slow != self.status.fields["slow_ranks"]:
            self.events.emit("slow_ranks", logging.WARNING if slow else logging.INFO, step=self.step, ranks=slow,
                             rank_step_time_s=[round(s, 5) for s in times])
            self.status.update(slow_ranks=slow, force=True)

    def _save(self, skipped: int, wait: bool) -> None:
        """Every rank writes its RNG state and snapshots its own part of the state for the writer."""
        spec, ctx = self.spec, self.ctx
        started = time.perf_counter()
        self.status.update(force=True, **({"state": State.CHECKPOINTING} if self.status.fields["state"] == State.RUNNING else {}))
        checkpoint.write_rank_state(spec.checkpoints, self.step, ctx.rank)
        meta = {"format": checkpoint.FORMAT, "global_step": self.step, "tokens_seen": self.tokens_seen,
                "sampler": self.sampler.state_dict(),
                "lr_schedule": self.schedule.to_dict(), "grad_scaler": None, "skipped_steps": skipped,
                "config_sha256": spec.config_sha256, "parent": self.parent_uri, "world_size": ctx.world,
                "parallel": self.kind}
        self.saver.save(self.step, shards.state_of(self.model, self.optim), meta, heartbeat=self._heartbeat)
        if wait:
            self.saver.wait(self._heartbeat)
        if ctx.rank == 0:
            self.events.emit("checkpoint_saved", step=self.step, blocked_s=round(time.perf_counter() - started, 5),
                             async_save=self.saver.async_save and not wait)
        self._drain()

    def _drain(self) -> None:
        for done in self.saver.drain():
            self._committed(done)

    def _committed(self, done: Committed) -> None:
        self.events.emit("checkpoint_committed", step=done.step, path=str(done.path), write_s=round(done.write_s, 4))
        fields: dict[str, Any] = {"last_checkpoint": str(done.path)}
        if self.status.fields["state"] == State.CHECKPOINTING:
            fields["state"] = State.RUNNING
        self.status.update(force=True, **fields)

    def _export(self) -> None:
        """The weights for evaluation and the registry, streamed tensor by tensor (no rank gathers the
        model); rank 0 adds the training metadata and renames the folder into place."""
        ctx = self.ctx
        choice = [str(weights.staging(self.spec.export_dir)) if ctx.rank == 0 else None]
        if ctx.world > 1:
            dist.broadcast_object_list(choice, src=0)
        tmp = Path(choice[0])
        try:
            shards.write_weights(self.model, tmp)
        except BaseException:
            if ctx.rank == 0:  # nothing half-written is left beside the export
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if ctx.rank == 0:
            extra = {"global_step": self.step, "tokens_seen": self.tokens_seen, "config_sha256": self.spec.config_sha256,
                     "parent": self.parent_uri, "lr_schedule": self.schedule.to_dict(),
                     "final_lr": self.schedule.lr(self.step - 1), "stable_step": self._stable_kept()}
            path = weights.complete(tmp, self.spec.model, self.spec.export_dir, extra)
            self.events.emit("exported", path=str(path), global_step=self.step)
        if ctx.world > 1:
            dist.barrier()

    def _stable_kept(self) -> int | None:
        """wsd: the step of this run's pre-decay checkpoint, which a child continues (None: none was taken)."""
        stable = self.schedule.stable_step
        return stable if stable in self.saver.pinned else None


def _finite_or_none(value: float, digits: int | None = None) -> float | None:
    if not math.isfinite(value):
        return None
    return round(value, digits) if digits is not None else value
