"""The evaluation gate: does the candidate beat the baseline by at least ``min_improvement``?

Compares bits per byte (tokenizer-independent). With no registered baseline the untrained
initial model of the same architecture is the floor to beat.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.score import Score


@dataclass
class Decision:
    passed: bool
    improvement_bpb: float
    reason: str


def decide(candidate: Score, baseline: Score, min_improvement: float) -> Decision:
    gain = baseline.bits_per_byte - candidate.bits_per_byte
    passed = gain >= min_improvement and gain > 0
    verdict = "beats" if passed else "does not beat"
    reason = (f"candidate {candidate.bits_per_byte:.4f} bpb {verdict} baseline "
              f"{baseline.bits_per_byte:.4f} bpb (gain {gain:+.4f}, required >= {min_improvement:+.4f})")
    return Decision(passed, gain, reason)


def report(candidate: Score, baseline: Score, baseline_info: dict[str, Any], decision: Decision) -> dict[str, Any]:
    return {
        "passed": decision.passed,
        "reason": decision.reason,
        "improvement_bpb": decision.improvement_bpb,
        "candidate": candidate.summary(),
        "baseline": {**baseline_info, **baseline.summary()},
    }


def markdown(rep: dict[str, Any]) -> str:
    c, b = rep["candidate"], rep["baseline"]
    return "\n".join([
        f"# Evaluation: {'PASSED' if rep['passed'] else 'FAILED'}", "", rep["reason"], "",
        "| model | loss (nats/token) | bits per byte | perplexity | tokens |", "|---|---|---|---|---|",
        f"| candidate | {c['loss']:.4f} | {c['bits_per_byte']:.4f} | {c['perplexity']:.2f} | {c['tokens']} |",
        f"| baseline ({b.get('kind')}: {b.get('uri') or '-'}) | {b['loss']:.4f} | {b['bits_per_byte']:.4f} "
        f"| {b['perplexity']:.2f} | {b['tokens']} |", ""])


def write(folder: Path, rep: dict[str, Any]) -> Path:
    from trainer.fsio import write_json_atomic, write_text_atomic

    write_text_atomic(folder / "report.md", markdown(rep))
    write_json_atomic(folder / "report.json", rep)
    return folder / "report.json"
