"""Asynchronous checkpoint saving: the loop is blocked only while the state is copied.

Every rank saves its own part (``trainer/shards.py``). ``save`` copies the rank's live state into
host buffers that DCP's stager keeps from one save to the next (pinned on GPU), and hands the copy
to one background writer thread, which writes the rank's shards and hashes them; rank 0's writer
then writes the metadata, the checksums last, and renames (``checkpoint.commit``). Training goes
on meanwhile. The next ``save`` first waits for the previous write, so at most one snapshot exists
and its buffers can be reused. ``wait`` is what SIGTERM and the end of training call: the last
checkpoint is always complete before exit. Before handing a snapshot over, rank 0 checks (one
statvfs) that the disk has room for the checkpoint's bytes and every rank hears its answer, so a
full disk fails the run before a torn checkpoint is written.

The buffers are allocated (and their pages touched) once, by the writer thread, right after the
optimizer state first exists, so even the first save only copies.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from trainer import DiskFull, TrainerError, checkpoint, shards

log = logging.getLogger("trainer.saver")


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def local_bytes(state: Any) -> tuple[int, int]:
    """(bytes, tensors) this rank holds of ``state``: its shards, tied weights counted once."""
    sizes = {(s := _local(t).untyped_storage()).data_ptr(): s.nbytes() for t in _tensors(state)}
    return sum(sizes.values()), len(sizes)


def _bytes_in(folder: Path) -> int:
    """Bytes written so far into ``folder`` (by every rank: the heartbeat's sign of progress)."""
    try:
        return sum(p.stat().st_size for p in folder.iterdir())
    except OSError:
        return 0


def _writer_thread(device: torch.device) -> None:
    """The writer thread yields the CPU to training (nice +10, this thread only): on a busy host the
    write takes a little longer instead of slowing every rank, which would all wait for this one.
    It works on its rank's GPU: the current CUDA device is per thread, and every rank's writer
    would otherwise stage through (and open a context on) device 0."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except OSError as exc:  # not permitted in some sandboxes: the write just competes as before
        log.warning("could not lower the checkpoint writer's priority: %s", exc)


@dataclass(frozen=True)
class Committed:
    step: int
    path: Path
    write_s: float


class Saver:
    """This rank's checkpoint writer. ``replicas``: how many ranks hold each tensor (DDP: every rank,
    FSDP: one), which turns this rank's bytes into the whole checkpoint's for the disk check."""

    def __init__(self, root: Path, keep_last_n: int, async_save: bool, device: torch.device, rank: int = 0,
                 world: int = 1, replicas: int = 1, after_state: Callable[[int], None] = lambda step: None,
                 heartbeat_every_s: float = 5.0) -> None:
        self.root, self.keep_last_n, self.async_save = root, keep_last_n, async_save
        self.rank, self.world, self.replicas = rank, world, replicas
        self.heartbeat_every_s = heartbeat_every_s
        pin = device.type == "cuda"
        self.stager = DefaultStager(StagingOptions(use_pinned_memory=pin, use_shared_memory=False,
                                                   use_async_staging=False, use_non_blocking_copy=pin))
        self.after_state = after_state
        self.group = shards.group()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer",
                                            initializer=_writer_thread, initargs=(device,))
        self._pending: Future | None = None
        self._writing: Path | None = None
        self._committed: list[Committed] = []
        self._allocating: Future | None = None
        self.reserved = False
        self.pinned: frozenset[int] = frozenset()  # steps whose checkpoints pruning keeps (wsd's stable state)

    def reserve(self, state: Any) -> None:
        """Allocate the snapshot buffers in the background (once, when the optimizer state exists):
        the stager keeps the buffers of the first copy for every later one."""
        if not self.reserved:
            self.reserved = True
            self._allocating = self._executor.submit(self.stager.stage, state)

    def save(self, step: int, state: dict, meta: dict, heartbeat: Callable[[], None] = lambda: None) -> None:
        """Snapshot and hand to the writer (and, when not async, wait for it); waits for the
        previous write first. Every rank calls it (the room check is a collective)."""
        self.wait(heartbeat)
        if self._allocating is not None:  # the buffers are being allocated: never copy into them meanwhile
            self._allocating.result()
            self._allocating = None
        snapshot = self.stager.stage(state)
        self._check_room(step, snapshot)
        self._writing = checkpoint.inprogress_dir(self.root, step)
        self._pending = self._executor.submit(self._write, step, snapshot, meta)
        if not self.async_save:
            self.wait(heartbeat)

    def _check_room(self, step: int, snapshot: Any) -> None:
        """Rank 0 checks the disk (after the wait: the previous checkpoint is on disk and pruning
        done) and every rank hears the answer, so all refuse together or none does."""
        verdict: list[str | None] = [None]
        if self.rank == 0:
            size, tensors = local_bytes(snapshot)
            try:
                checkpoint.ensure_room(self.root, step, size * self.world // self.replicas, tensors)
            except DiskFull as exc:
                verdict = [str(exc)]
        if self.group is not None:
            dist.broadcast_object_list(verdict, src=0)
        if verdict[0] is not None:
            if self.group is not None:
                dist.barrier()  # every rank's RNG file is written before the folder goes
            if self.rank == 0:
                checkpoint.clear_step(self.root, step)
            raise DiskFull(verdict[0])

    def _write(self, step: int, snapshot: dict, meta: dict) -> Committed | None:
        started = time.perf_counter()
        try:
            shards.write(snapshot, checkpoint.inprogress_dir(self.root, step), self.rank, self.group)
        except BaseException as exc:  # DCP reports every rank's failure as one CheckpointException
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            if self.rank == 0:
                checkpoint.clear_step(self.root, step)
            if checkpoint.disk_full(exc):
                raise checkpoint.filled(self.root, step) from exc
            raise TrainerError(f"writing checkpoint {checkpoint.step_dir(self.root, step).name} failed: "
                               f"{shards.failed(exc)}") from exc
        if self.rank != 0:
            return None
        self.after_state(step)
        path = checkpoint.commit(self.root, step, meta, self.world, self.keep_last_n, pinned=self.pinned)
        return Committed(step, path, time.perf_counter() - started)

    def drain(self) -> list[Committed]:
        """Writes committed since the last look; rank 0 only commits. A failed write stays pending:
        the next ``save`` or ``wait`` raises it, which every rank calls at the same step (each rank
        sees the failure at a different moment: raising here would leave the others waiting in the
        next collective)."""
        if self._pending is not None and self._pending.done() and self._pending.exception() is None:
            pending, self._pending = self._pending, None
            self._keep(pending.result())
        done, self._committed = self._committed, []
        return done

    def _keep(self, committed: Committed | None) -> None:
        if committed is not None:
            self._committed.append(committed)

    def wait(self, heartbeat: Callable[[], None] = lambda: None) -> None:
        """Block until the pending write is committed. ``heartbeat`` is called every ``heartbeat_every_s``
        while bytes are still being written, so a slow write is told from a hung one."""
        if self._pending is None:
            return
        every_s, folder = self.heartbeat_every_s, self._writing
        last = _bytes_in(folder) if folder else 0
        while True:
            try:
                committed = self._pending.result(timeout=every_s)
                break
            except BaseException as exc:
                if isinstance(exc, TimeoutError) and not self._pending.done():
                    if folder is not None and (now := _bytes_in(folder)) != last:
                        last = now
                        heartbeat()
                    continue
                self._pending = None  # raised once: a later wait (the loop's finally) does not raise it again
                raise
        self._pending = None
        self._keep(committed)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.stager.close()
