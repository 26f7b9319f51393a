"""Fault injection for tests, read from ``TAXIWAY_TEST_*`` environment variables; inert when unset.

Crash tests need faults at exact points (a SIGKILL in the middle of a checkpoint write, a NaN at
step 3, one slow rank); timing a kill from outside cannot hit them reliably. Each hook is one
environment variable, and the loop reaches them only as ``trainer/hooks.py`` hooks:

- ``TAXIWAY_TEST_HOLD=step:6`` — rank 0 stops after finishing step 6; ``write:8`` — rank 0's
  checkpoint writer stops once every rank's shards of step 8 are written (before ``meta.json`` and
  ``checksums.json``).
  Either writes ``<run>/train/held-<kind>-<step>`` and then sleeps until it is killed.
- ``TAXIWAY_TEST_NAN_STEPS=3,4`` — the loss of those steps (1-based) becomes NaN on every rank
  before the backward pass, so the gradients do too.
- ``TAXIWAY_TEST_SPIKE_STEPS=25`` — the loss measured at those steps is 10x (the update is not).
- ``TAXIWAY_TEST_SLOW_RANK=1:0.05`` — rank 1 sleeps 0.05 s before each batch.
- ``TAXIWAY_TEST_STALL_DATA_STEP=3`` — the batch for step 3 never arrives.
- ``TAXIWAY_TEST_FAKE_TORCH=1:0.0.1`` — rank 1 reports torch version 0.0.1 in the startup check.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trainer.hooks import LoopHook


def _rank_value(raw: str | None) -> tuple[int, str] | None:
    if not raw:
        return None
    rank, _, value = raw.partition(":")
    return int(rank), value


def _steps(raw: str | None) -> frozenset[int]:
    return frozenset(int(s) for s in (raw or "").split(",") if s)


@dataclass(frozen=True)
class Faults(LoopHook):
    scratch: Path                     # where hold markers go (the run's train/ folder)
    hold: tuple[str, int] | None = None
    nan_steps: frozenset[int] = frozenset()
    spike_steps: frozenset[int] = frozenset()
    slow_rank: tuple[int, float] | None = None
    stall_data_step: int | None = None
    fake_torch: tuple[int, str] | None = None

    @classmethod
    def from_env(cls, scratch: Path) -> list[LoopHook]:
        """The run's fault hooks: none unless a ``TAXIWAY_TEST_*`` variable is set."""
        env = os.environ
        hold = env.get("TAXIWAY_TEST_HOLD")
        slow = _rank_value(env.get("TAXIWAY_TEST_SLOW_RANK"))
        faults = cls(
            scratch=scratch,
            hold=(hold.split(":")[0], int(hold.split(":")[1])) if hold else None,
            nan_steps=_steps(env.get("TAXIWAY_TEST_NAN_STEPS")),
            spike_steps=_steps(env.get("TAXIWAY_TEST_SPIKE_STEPS")),
            slow_rank=(slow[0], float(slow[1])) if slow else None,
            stall_data_step=int(env["TAXIWAY_TEST_STALL_DATA_STEP"]) if env.get("TAXIWAY_TEST_STALL_DATA_STEP") else None,
            fake_torch=_rank_value(env.get("TAXIWAY_TEST_FAKE_TORCH")),
        )
        return [faults] if faults != cls(scratch) else []

    def _hold(self, kind: str, step: int) -> None:
        if self.hold == (kind, step):
            marker = self.scratch / f"held-{kind}-{step}"
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(os.getpid()))
            while True:
                time.sleep(3600)

    def after_step(self, rank: int, step: int) -> None:
        if rank == 0:
            self._hold("step", step)

    def after_state_written(self, step: int) -> None:
        self._hold("write", step)

    def loss_for_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """NaN on the chosen steps, so the gradients are too."""
        return loss * float("nan") if step in self.nan_steps else loss

    def loss_measured(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """10x on the chosen steps, the update untouched."""
        return loss * 10 if step in self.spike_steps else loss

    def before_batch(self, rank: int, step: int) -> None:
        if self.slow_rank and self.slow_rank[0] == rank:
            time.sleep(self.slow_rank[1])
        if self.stall_data_step == step:
            while True:
                time.sleep(3600)

    def torch_version(self, rank: int, real: str) -> str:
        return self.fake_torch[1] if self.fake_torch and self.fake_torch[0] == rank else real
