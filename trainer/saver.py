"""Asynchronous checkpoint saving: the loop is blocked only while the state is copied.

``save`` copies the model and optimizer state into reusable host buffers (pinned on GPU) and
hands the copy to one background writer thread, which serializes, hashes, fsyncs and renames it
(``checkpoint.commit``). Training goes on meanwhile. The next ``save`` first waits for the
previous write, so at most one snapshot exists and its buffers can be reused. ``wait`` is what
SIGTERM and the end of training call: the last checkpoint is always complete before exit.
Before handing a snapshot over, ``save`` checks (one statvfs) that the disk has room for its
exact bytes, so a full disk fails the run before a torn checkpoint is written.

The buffers are allocated (and their pages touched) once, by the writer thread, right after the
optimizer state first exists, so even the first save only copies.
"""

from __future__ import annotations

import copy
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

from trainer import checkpoint

log = logging.getLogger("trainer.saver")


def _walk(obj: Any, fn: Callable[[str, torch.Tensor], Any], prefix: str = "") -> Any:
    """Rebuild ``obj`` with every tensor replaced by ``fn(path, tensor)``; other leaves are copied."""
    if isinstance(obj, torch.Tensor):
        return fn(prefix, obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn, f"{prefix}/{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(v, fn, f"{prefix}/{i}") for i, v in enumerate(obj))
    return copy.deepcopy(obj)


def _storage_bytes(state: Any) -> dict[int, int]:
    """Bytes of each distinct storage in ``state``, what torch.save writes (tied weights once)."""
    sizes: dict[int, int] = {}
    _walk(state, lambda path, t: sizes.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()))
    return sizes


def _identity(t: torch.Tensor) -> tuple:
    """Tensors that are views of the same memory (tied embeddings) share one staging buffer."""
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


class Staging:
    """Host buffers, one per distinct tensor of the state, reused by every snapshot."""

    def __init__(self, pin: bool) -> None:
        self.pin = pin
        self.buffers: dict[str, torch.Tensor] = {}
        self.ties: dict[str, str] = {}

    def layout(self, state: Any) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Shapes and dtypes to allocate (main thread: reads metadata only)."""
        seen: dict[tuple, str] = {}
        out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}

        def visit(path: str, t: torch.Tensor) -> None:
            key = _identity(t)
            if key in seen:
                self.ties[path] = seen[key]
            else:
                seen[key] = path
                out[path] = (tuple(t.shape), t.dtype)

        _walk(state, visit)
        return out

    def allocate(self, layout: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> None:
        """Writer thread: allocate and touch every buffer, so copying later never page-faults."""
        for path, (shape, dtype) in layout.items():
            buf = self.buffers.get(path)
            if buf is None or tuple(buf.shape) != shape or buf.dtype != dtype:
                self.buffers[path] = torch.zeros(shape, dtype=dtype, pin_memory=self.pin)

    def copy(self, state: Any) -> Any:
        """The snapshot: ``state`` with every tensor copied into its buffer (main thread)."""
        def stage(path: str, t: torch.Tensor) -> torch.Tensor:
            path = self.ties.get(path, path)
            buf = self.buffers.get(path)
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = self.buffers[path] = torch.empty(t.shape, dtype=t.dtype, pin_memory=self.pin)
            return buf.copy_(t.detach(), non_blocking=self.pin)

        out = _walk(state, stage)
        if self.pin:
            torch.cuda.synchronize()
        return out


def _lower_priority() -> None:
    """The writer thread yields the CPU to training (nice +10, this thread only): on a busy host the
    write takes a little longer instead of slowing every rank, which would all wait for this one."""
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
    """Rank 0's checkpoint writer; other ranks only write their RNG file (see the loop)."""

    def __init__(self, root: Path, keep_last_n: int, async_save: bool, pin: bool,
                 after_model: Callable[[int], None] = lambda step: None, heartbeat_every_s: float = 5.0) -> None:
        self.root, self.keep_last_n, self.async_save = root, keep_last_n, async_save
        self.heartbeat_every_s = heartbeat_every_s
        self.staging = Staging(pin)
        self.after_model = after_model
        self.bytes_written = 0
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer",
                                            initializer=_lower_priority)
        self._pending: Future | None = None
        self._committed: list[Committed] = []
        self._allocating: Future | None = None
        self.reserved = False
        self.pinned: frozenset[int] = frozenset()  # steps whose checkpoints pruning keeps (wsd's stable state)

    def reserve(self, state: Any) -> None:
        """Allocate the snapshot buffers in the background (once, when the optimizer state exists)."""
        if not self.reserved:
            self.reserved = True
            self._allocating = self._executor.submit(self.staging.allocate, self.staging.layout(state))

    def save(self, step: int, model_state: dict, optim_state: dict, meta: dict, fresh: bool,
             heartbeat: Callable[[], None] = lambda: None) -> None:
        """Snapshot and hand to the writer (and, when not async, wait for it); waits for the
        previous write first."""
        self.wait(heartbeat)
        if self._allocating is not None:  # the buffers are being allocated: never copy into them meanwhile
            self._allocating.result()
            self._allocating = None
        snapshot = (model_state, optim_state) if fresh else self.staging.copy((model_state, optim_state))
        sizes = _storage_bytes(snapshot)  # after the wait: the previous checkpoint is on disk and pruning done
        checkpoint.ensure_room(self.root, step, sum(sizes.values()), len(sizes))
        self._pending = self._executor.submit(self._write, step, *snapshot, meta)
        if not self.async_save:
            self.wait(heartbeat)

    def _write(self, step: int, model_state: dict, optim_state: dict, meta: dict) -> Committed:
        started = time.perf_counter()
        path = checkpoint.commit(self.root, step, model_state, optim_state, meta, self.keep_last_n,
                                 progress=self._count, after_model=lambda: self.after_model(step), pinned=self.pinned)
        return Committed(step, path, time.perf_counter() - started)

    def _count(self, n: int) -> None:
        with self._lock:
            self.bytes_written += n

    def drain(self) -> list[Committed]:
        """Writes committed since the last look (re-raises a writer failure)."""
        if self._pending is not None and self._pending.done():
            pending, self._pending = self._pending, None
            self._committed.append(pending.result())
        done, self._committed = self._committed, []
        return done

    def wait(self, heartbeat: Callable[[], None] = lambda: None) -> None:
        """Block until the pending write is committed. ``heartbeat`` is called every ``heartbeat_every_s``
        while bytes are still being written, so a slow write is told from a hung one."""
        if self._pending is None:
            return
        every_s = self.heartbeat_every_s
        last = self.bytes_written
        while True:
            try:
                committed = self._pending.result(timeout=every_s)
                break
            except TimeoutError:
                if self.bytes_written != last:
                    last = self.bytes_written
                    heartbeat()
        self._pending = None
        self._committed.append(committed)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
