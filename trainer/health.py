"""Health checks of a running job: non-finite steps, loss spikes, slow ranks, a stuck data loader.

Each detector is fed one number (or one vector) per step by the loop and answers with what
happened; the loop turns answers into events and status fields. None of them talks to the
process group: the loop gathers everything they need in its one per-step collective.
"""

from __future__ import annotations

import faulthandler
import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer import NonFiniteLoss

log = logging.getLogger("trainer.health")


class NonFiniteGuard:
    """A step whose loss or gradient norm is NaN/Inf is skipped; ``limit`` of them in a row is fatal."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.streak = 0
        self.skipped = 0

    def observe(self, finite: bool, step: int) -> bool:
        """True when the step must be skipped. Raises after ``limit`` consecutive bad steps."""
        if finite:
            self.streak = 0
            return False
        self.streak += 1
        self.skipped += 1
        if self.streak >= self.limit:
            raise NonFiniteLoss(f"loss or gradient was NaN/Inf in {self.streak} consecutive steps "
                                f"(through step {step}; train.max_nonfinite_steps={self.limit}): "
                                "lower train.lr, check the data, or resume from an earlier checkpoint")
        return True


class SpikeDetector:
    """A loss above mean + ``sigma`` standard deviations of the last ``window`` losses is a spike.

    Spikes are not added to the window, so a run that keeps diverging keeps being reported.
    """

    def __init__(self, window: int, sigma: float, min_samples: int = 10) -> None:
        self.losses: deque[float] = deque(maxlen=window)
        self.sigma = sigma
        self.min_samples = min(min_samples, window)

    def observe(self, loss: float) -> dict[str, float] | None:
        if not math.isfinite(loss):
            return None
        if len(self.losses) >= self.min_samples:
            mean = statistics.fmean(self.losses)
            std = statistics.pstdev(self.losses, mean)
            if loss > mean + self.sigma * std and std > 0:
                return {"loss": loss, "window_mean": mean, "window_std": std,
                        "threshold": mean + self.sigma * std}
        self.losses.append(loss)
        return None


class StragglerDetector:
    """Names a rank whose step time exceeds ``factor`` × the median for ``patience`` steps in a row.

    The median is the lower median, so with two ranks the comparison is against the faster one
    (the mean of two can never be exceeded twofold).
    """

    def __init__(self, world: int, factor: float = 2.0, patience: int = 5) -> None:
        self.factor, self.patience = factor, patience
        self.streaks = [0] * world

    def observe(self, times: list[float]) -> list[int]:
        """Ranks currently named slow."""
        if len(times) < 2:
            return []
        median = statistics.median_low(times)
        for rank, t in enumerate(times):
            self.streaks[rank] = self.streaks[rank] + 1 if t > self.factor * median else 0
        return [r for r, n in enumerate(self.streaks) if n >= self.patience]


class LocalTimer:
    """This rank's own share of a step: from step start until the backward that exchanges gradients.

    That span (data, forward, and the backward of micro-batches that do not communicate) holds
    no collective under DDP, so a slow rank shows up in its own time instead of in everyone's
    wait. On GPU it is measured with CUDA events and reported one step late (the events of the
    previous step are complete by then, so no extra synchronisation is needed).
    """

    def __init__(self, device: Any) -> None:
        import torch  # torch (~1 s): the detectors are plain Python; only this timer needs it

        self.cuda = device.type == "cuda"
        if self.cuda:
            self._pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                           for _ in range(2)]
            self._i = 0
            self._started = False
        self._t0 = self._t1 = 0.0

    def begin(self) -> None:
        if self.cuda:
            self._pairs[self._i][0].record()
        else:
            self._t0 = time.perf_counter()

    def mark(self) -> None:
        if self.cuda:
            self._pairs[self._i][1].record()
        else:
            self._t1 = time.perf_counter()

    def seconds(self) -> float:
        """Seconds of the last complete measurement (GPU: the previous step's)."""
        if not self.cuda:
            return self._t1 - self._t0
        previous = self._pairs[1 - self._i]
        value = previous[0].elapsed_time(previous[1]) / 1000 if self._started else 0.0
        self._i, self._started = 1 - self._i, True
        return value


class DataWatchdog:
    """Fails the process when one batch takes longer than ``timeout_s`` to arrive.

    A data loader stuck on a dead mount never returns, so the main thread cannot raise: a
    daemon thread dumps every thread's stack (to the log and to ``stacks_file``), lets
    ``on_fire`` record the failure, and exits the process with ``exit_code``.
    """

    def __init__(self, timeout_s: float, stacks_file: Path, on_fire: Callable[[str], Any], exit_code: int) -> None:
        self.timeout_s, self.stacks_file, self.on_fire, self.exit_code = timeout_s, stacks_file, on_fire, exit_code
        self._since: float | None = None
        self._step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="data-watchdog", daemon=True)
        self._thread.start()

    @contextmanager
    def waiting(self, step: int) -> Iterator[None]:
        self._step, self._since = step, time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        tick = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(tick):
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout_s:
                self._fire()

    def _fire(self) -> None:
        reason = (f"data loader produced no batch for step {self._step} within {self.timeout_s:g} s "
                  f"(train.data_timeout_s); stacks of all threads in {self.stacks_file}")
        log.error(reason)
        self.stacks_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stacks_file, "w") as fh:
            faulthandler.dump_traceback(fh, all_threads=True)
        faulthandler.dump_traceback(all_threads=True)
        try:
            self.on_fire(reason)
        finally:
            os._exit(self.exit_code)
