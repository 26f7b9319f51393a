"""Points in the training loop where something outside it may act, as a list of callbacks (the way
OLMo-core's trainer callbacks work): the loop calls ``Hooks``, never a particular hook.

Today the only hooks are the tests' fault injections (``trainer/faults.py``, from ``TAXIWAY_TEST_*``);
without them the list is empty and each call is a loop over nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class LoopHook:
    """Every point a hook may act at; each default does nothing. Steps are 1-based: the step the
    batch, loss or update belongs to."""

    def before_batch(self, rank: int, step: int) -> None:
        """Before a rank fetches the batch for ``step``."""

    def loss_for_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The loss that is back-propagated."""
        return loss

    def loss_measured(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """The step's loss as health checks and logs see it (the update is not affected)."""
        return loss

    def after_step(self, rank: int, step: int) -> None:
        """After the update of ``step``."""

    def after_state_written(self, step: int) -> None:
        """Every rank's part of checkpoint ``step`` is on disk; rank 0's writer has yet to write the
        metadata and checksums and rename the folder."""

    def torch_version(self, rank: int, real: str) -> str:
        """The torch version this rank reports in the startup check."""
        return real


class Hooks(LoopHook):
    """The hooks of one run, called in order."""

    def __init__(self, hooks: Iterable[LoopHook] = ()) -> None:
        self.hooks = list(hooks)

    def before_batch(self, rank: int, step: int) -> None:
        for hook in self.hooks:
            hook.before_batch(rank, step)

    def loss_for_backward(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        for hook in self.hooks:
            loss = hook.loss_for_backward(step, loss)
        return loss

    def loss_measured(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        for hook in self.hooks:
            loss = hook.loss_measured(step, loss)
        return loss

    def after_step(self, rank: int, step: int) -> None:
        for hook in self.hooks:
            hook.after_step(rank, step)

    def after_state_written(self, step: int) -> None:
        for hook in self.hooks:
            hook.after_state_written(step)

    def torch_version(self, rank: int, real: str) -> str:
        for hook in self.hooks:
            real = hook.torch_version(rank, real)
        return real
