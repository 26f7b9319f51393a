"""The evaluation gate: is the candidate better than the baseline, by enough, with confidence?

Pass when the one-sided lower confidence bound of the bits-per-byte improvement (paired
bootstrap, ``eval.confidence``) is above zero and at least ``eval.min_improvement``. A tie (the
same model twice) has a lower bound of exactly zero and fails: the champion moves only for a
model that is measurably better.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval.score import Score
from eval.stats import Interval, Paired, pair, paired_bootstrap


@dataclass(frozen=True)
class Decision:
    passed: bool
    interval: Interval
    unit: str                  # what was resampled: "sequence" or "document"
    units: int
    min_improvement: float
    reason: str

    @property
    def improvement_bpb(self) -> float:
        return self.interval.point

    def to_dict(self) -> dict:
        iv = self.interval
        return {"method": "paired bootstrap", "unit": self.unit, "units": self.units,
                "confidence": iv.confidence, "samples": iv.samples, "seed": iv.seed,
                "min_improvement": self.min_improvement, "improvement_bpb": iv.point,
                "lower_bpb": iv.lower, "upper_bpb": iv.upper}


def decide(candidate: Score, baseline: Score, baseline_label: str, min_improvement: float,
           confidence: float, samples: int, seed: int) -> tuple[Decision, Paired]:
    paired = pair(candidate, baseline)
    iv = paired_bootstrap(paired, confidence, samples, seed)
    passed = iv.lower > 0 and iv.lower >= min_improvement
    bound = f"one-sided {confidence:.0%} lower bound {iv.lower:+.4f}"
    if passed:
        verdict = f"{bound} >= required {min_improvement:+.4f}"
    elif iv.lower <= 0:
        verdict = f"not significant: {bound} <= 0"
    else:
        verdict = f"{bound} < required {min_improvement:+.4f}"
    reason = (f"candidate {candidate.bits_per_byte:.4f} bpb {'beats' if passed else 'does not beat'} "
              f"{baseline_label} {baseline.bits_per_byte:.4f} bpb: improvement {iv.point:+.4f} bpb, {verdict} "
              f"(paired bootstrap over {len(paired)} {paired.unit}s, {samples} resamples)")
    return Decision(passed, iv, paired.unit, len(paired), min_improvement, reason), paired


def refresh_decision(fixed: Decision, fresh: Decision, max_regression_bpb: float) -> tuple[bool, str]:
    """A refresh passes when it is significantly better on the new data (``fresh``, the gate above)
    and loses at most ``max_regression_bpb`` on the fixed validation set (point estimate)."""
    regressed = fixed.improvement_bpb < -max_regression_bpb
    passed = fresh.passed and not regressed
    return passed, (f"refresh gate {'PASSED' if passed else 'FAILED'}: new data: {fresh.reason}; fixed validation "
                     f"set: improvement {fixed.improvement_bpb:+.4f} bpb, {'beyond' if regressed else 'within'} the "
                     f"allowed regression of {-max_regression_bpb:+.4f} bpb")
