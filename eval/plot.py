"""``comparison.png``: candidate vs baseline, unit by unit, beside the gate's bounds."""

from __future__ import annotations

import io

from eval.gate import Decision
from eval.stats import Paired


def comparison_png(paired: Paired, decision: Decision, cand_label: str, base_label: str) -> bytes:
    """PNG bytes (the caller writes them atomically). Agg backend: no display needed."""
    import matplotlib  # matplotlib (~0.13 s): only drawing the report needs it

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # after use("Agg"): the backend is chosen first

    base, cand = paired.base_bpb, paired.cand_bpb
    fig = Figure(figsize=(11, 4.5), dpi=100)
    left, right = fig.subplots(1, 2)
    lo, hi = float(min(base.min(), cand.min())), float(max(base.max(), cand.max()))
    left.scatter(base, cand, s=8, alpha=0.5)
    left.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="equal")
    left.set_xlabel(f"{base_label} (bits/byte)")
    left.set_ylabel(f"{cand_label} (bits/byte)")
    left.set_title(f"per {paired.unit}: below the line = candidate better")
    left.legend(loc="upper left")

    diff = base - cand
    right.hist(diff, bins=min(50, max(10, len(diff) // 5)), color="tab:blue", alpha=0.7)
    iv = decision.interval
    right.axvline(0, color="black", linewidth=1, label="no change")
    right.axvline(iv.point, color="tab:green", label=f"improvement {iv.point:+.4f}")
    right.axvline(iv.lower, color="tab:red", linestyle="--",
                  label=f"{iv.confidence:.0%} lower bound {iv.lower:+.4f}")
    if decision.min_improvement > 0:
        right.axvline(decision.min_improvement, color="tab:orange", linestyle=":",
                      label=f"required {decision.min_improvement:+.4f}")
    right.set_xlabel("baseline - candidate (bits/byte)")
    right.set_ylabel(f"{paired.unit}s")
    right.set_title(f"gate {'PASSED' if decision.passed else 'FAILED'} ({len(diff)} {paired.unit}s)")
    right.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()

