"""The learning-rate schedule as a pure function of the global step.

Because the LR depends on nothing but the step, resuming needs only ``global_step`` and the
schedule's anchor (``origin_step``, ``start_lr``) from the checkpoint. Two kinds:

``rewarm`` (the default). A run that starts fresh warms up linearly to ``lr`` and decays (cosine
or linear) to ``min_lr`` at its last step. A run that continues a parent model starts at the
parent's global step and at the LR the parent ended with, and decays from there: no jump (the
parent's optimizer moments may not be exported, so a restart at peak LR would hit fresh Adam
moments hardest). With ``rewarmup_steps`` (a refresh sets it) the LR climbs from the parent's
final LR back to ``lr`` over those steps, then decays to ``min_lr``: every refresh warms up and
decays again.

``wsd`` (warmup–stable–decay, continued across refreshes). The LR warms up (or, continuing a
parent, climbs from its LR over ``rewarmup_steps``) to ``lr`` and stays there; only the last
``decay_steps`` updates decay to ``min_lr``, reaching it at the last step. The state at
``stable_step`` (just before the first decayed update) is the main trajectory: the trainer keeps
its checkpoint, and the next refresh continues it at the stable LR rather than the decayed
weights that were released (Ibrahim et al. 2024; Hägele et al. 2024).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from trainer.spec import ScheduleSettings, TrainSettings

Kind = Literal["rewarm", "wsd"]


@dataclass(frozen=True)
class Schedule:
    peak_lr: float
    min_lr: float
    warmup_steps: int
    decay: Literal["cosine", "linear"]
    origin_step: int           # global step this run (or its first attempt) started from
    end_step: int              # global step at which training stops
    start_lr: float | None     # None: fresh run (warmup to peak); else the LR of the parent state continued
    rewarmup_steps: int = 0    # with a parent: steps from start_lr back up to peak_lr
    kind: Kind = "rewarm"
    decay_steps: int = 0       # wsd: the last updates, which decay from peak_lr to min_lr

    @classmethod
    def from_config(cls, t: TrainSettings, origin_step: int = 0, start_lr: float | None = None,
                    shape: ScheduleSettings | None = None) -> Schedule:
        kind, decay_steps = (shape.kind, shape.decay_steps) if shape is not None else ("rewarm", 0)
        return cls(peak_lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps, decay=t.decay,
                   origin_step=origin_step, end_step=origin_step + t.steps, start_lr=start_lr,
                   rewarmup_steps=t.rewarmup_steps, kind=kind, decay_steps=decay_steps)

    @property
    def stable_step(self) -> int | None:
        """wsd: the global step where the decay starts; the state there is what the next refresh continues."""
        if self.kind != "wsd":
            return None
        return max(self.origin_step, self.end_step - self.decay_steps)

    def _shape(self, progress: float) -> float:
        progress = min(1.0, max(0.0, progress))
        return 0.5 * (1 + math.cos(math.pi * progress)) if self.decay == "cosine" else 1.0 - progress

    def lr(self, step: int) -> float:
        """LR for the update that takes the model from ``step`` to ``step + 1``."""
        i = step - self.origin_step
        if self.start_lr is None:
            if i < self.warmup_steps:
                return self.peak_lr * (i + 1) / self.warmup_steps
            top, bottom, first = self.peak_lr, self.min_lr, self.warmup_steps
        elif self.rewarmup_steps:
            if i < self.rewarmup_steps:
                return self.start_lr + (self.peak_lr - self.start_lr) * (i + 1) / self.rewarmup_steps
            top, bottom, first = self.peak_lr, self.min_lr, self.rewarmup_steps
        elif self.kind == "wsd":
            top, bottom, first = self.peak_lr, self.min_lr, 0
        else:
            top, bottom, first = self.start_lr, min(self.min_lr, self.start_lr), 0
        if self.kind == "wsd":
            stable = self.stable_step
            if step < stable:
                return top
            return bottom + self._shape((step - stable + 1) / max(1, self.end_step - stable)) * (top - bottom)
        span = max(1, self.end_step - self.origin_step - first)
        return bottom + self._shape((i - first) / span) * (top - bottom)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Schedule:
        """A schedule as a checkpoint's ``meta.json`` records it (older ones lack ``kind``, ``decay_steps``)."""
        return cls(**raw)
