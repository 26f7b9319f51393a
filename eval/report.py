"""The evaluation report: ``report.json`` (for machines), ``report.md`` (for people),
``comparison.png`` and ``per_unit.csv`` (the paired figures the gate resampled)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from eval.gate import Decision
from eval.markdown import code, fenced, text
from eval.plot import comparison_png
from eval.score import Score
from eval.stats import Paired


def build(candidate: Score, baseline: Score, baseline_info: dict[str, Any], decision: Decision,
          generations: list[dict[str, Any]], model: str) -> dict[str, Any]:
    rep = {
        "passed": decision.passed,
        "reason": decision.reason,
        "improvement_bpb": decision.improvement_bpb,
        "gate": decision.to_dict(),
        "candidate": {"model": model, **candidate.summary()},
        "baseline": {**baseline_info, **baseline.summary()},
        "generations": generations,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    rep["summary"] = summary(rep)
    return rep


def summary(rep: dict[str, Any]) -> str:
    """One paragraph: the registered version's description."""
    c, b, g = rep["candidate"], rep["baseline"], rep["gate"]
    against = (f"No baseline ({b['note']}): compared against the {b['floor']} floor of the validation set."
               if b["kind"] == "floor" else f"Baseline: {b['label']}.")
    return (f"{against} Gate {'PASSED' if rep['passed'] else 'FAILED'}: validation {c['bits_per_byte']:.4f} bits/byte "
            f"(loss {c['loss']:.4f} nats/token, perplexity {c['perplexity']:.2f}) vs {b['bits_per_byte']:.4f}; "
            f"improvement {g['improvement_bpb']:+.4f} bpb, one-sided {g['confidence']:.0%} lower bound "
            f"{g['lower_bpb']:+.4f} (required > 0 and >= {g['min_improvement']:+.4f}; paired bootstrap over "
            f"{g['units']} {g['unit']}s, {g['samples']} resamples, seed {g['seed']}).")


def markdown(rep: dict[str, Any]) -> str:
    c, b, g = rep["candidate"], rep["baseline"], rep["gate"]
    lines = [
        f"# Evaluation: {'PASSED' if rep['passed'] else 'FAILED'}", "", rep["summary"], "", rep["reason"], "",
        "| model | loss (nats/token) | bits per byte | perplexity | tokens | bytes |", "|---|---|---|---|---|---|",
        f"| candidate | {c['loss']:.4f} | {c['bits_per_byte']:.4f} | {c['perplexity']:.2f} | {c['tokens']} | {c['bytes']} |",
        f"| {b['label']} | {b['loss']:.4f} | {b['bits_per_byte']:.4f} | {b['perplexity']:.2f} | {b['tokens']} "
        f"| {b['bytes']} |", "",
        "| gate | value |", "|---|---|",
        f"| improvement (baseline - candidate) | {g['improvement_bpb']:+.4f} bits/byte |",
        f"| one-sided {g['confidence']:.0%} bounds | [{g['lower_bpb']:+.4f}, {g['upper_bpb']:+.4f}] |",
        f"| required | > 0 and >= {g['min_improvement']:+.4f} |",
        f"| paired bootstrap | {g['units']} {g['unit']}s, {g['samples']} resamples, seed {g['seed']} |", "",
        "![per-unit comparison](comparison.png)", "",
    ]
    if "forgetting" in rep:
        lines += forgetting_markdown(rep["forgetting"])
    if "reported" in rep:
        lines += reported_markdown(rep["reported"])
    if rep["generations"]:
        lines += ["## Generations", ""]
        for gen in rep["generations"]:
            lines += [f"Prompt {code(gen['prompt'])} (seed {gen['seed']}, temperature {gen['temperature']}, "
                      f"top-k {gen['top_k']}):", "", fenced(gen["text"]), ""]
    return "\n".join(lines)


def per_unit_csv(paired: Paired) -> str:
    rows = [f"{paired.unit},candidate_bits,candidate_bytes,baseline_bits,baseline_bytes"]
    rows += [f"{i},{cb:.6f},{cy},{bb:.6f},{by}" for i, (cb, cy, bb, by) in enumerate(zip(
        paired.cand_bits, paired.cand_bytes, paired.base_bits, paired.base_bytes, strict=True))]
    return "\n".join(rows) + "\n"


def files(rep: dict[str, Any], paired: Paired, decision: Decision) -> dict[str, bytes]:
    """Every file of the report, ``report.json`` last (the stage's completion marker)."""
    return {
        "per_unit.csv": per_unit_csv(paired).encode(),
        "comparison.png": comparison_png(paired, decision, "candidate", rep["baseline"]["label"]),
        "report.md": markdown(rep).encode(),
        "report.json": (json.dumps(rep, indent=2) + "\n").encode(),
    }


def with_refresh(rep: dict[str, Any], candidate: Score, baseline: Score, fresh: Decision, passed: bool,
                 reason: str, max_regression_bpb: float) -> dict[str, Any]:
    """The report of a refresh: both sets side by side, the verdict the refresh gate gave."""
    out = {**rep, "passed": passed, "reason": reason, "refresh": {
        "fixed": {"improvement_bpb": rep["improvement_bpb"], "max_regression_bpb": max_regression_bpb},
        "fresh": {"gate": fresh.to_dict(), "reason": fresh.reason, "candidate": candidate.summary(),
                  "baseline": baseline.summary()}}}
    c, b = rep["candidate"], rep["baseline"]
    out["summary"] = (f"{reason}. Fixed validation set: {c['bits_per_byte']:.4f} vs {b['bits_per_byte']:.4f} bits/byte "
                      f"({b['label']}); new data: {candidate.bits_per_byte:.4f} vs {baseline.bits_per_byte:.4f}.")
    return out


def with_forgetting(rep: dict[str, Any], rows: list[dict[str, Any]], left_out: list[dict[str, str]]) -> dict[str, Any]:
    """A refresh's forgetting: parent vs candidate bits/byte on the fixed validation set and on each
    earlier batch's held-out slice (``rows``, newest first); ``delta_bpb`` > 0 is what the candidate forgot."""
    c, b = rep["candidate"], rep["baseline"]
    sets = [{"set": "fixed validation", "batch": None, "parent_bpb": b["bits_per_byte"], "candidate_bpb": c["bits_per_byte"]}]
    sets += [{"set": f"batch {r['batch']} held-out", **r} for r in rows]
    for row in sets:
        row["delta_bpb"] = row["candidate_bpb"] - row["parent_bpb"]
    return {**rep, "forgetting": {"sets": sets, "left_out": left_out}}


def forgetting_markdown(forgetting: dict[str, Any]) -> list[str]:
    lines = ["## Forgetting", "", "Bits per byte, parent vs candidate; a positive change is what the candidate forgot.",
             "", "| set | parent | candidate | change |", "|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['parent_bpb']:.4f} | {r['candidate_bpb']:.4f} | {r['delta_bpb']:+.4f} |"
              for r in forgetting["sets"]]
    if forgetting["left_out"]:
        lines += ["", "Left out: " + "; ".join(f"batch {r['batch']} ({r['reason']})" for r in forgetting["left_out"])]
    return [*lines, ""]



def with_reported(rep: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's own sets (``eval.report_sets``), baseline vs candidate bits/byte: shown beside the gate,
    never deciding it; ``improvement_bpb`` > 0 is the candidate's gain."""
    return {**rep, "reported": [{**r, "improvement_bpb": r["baseline_bpb"] - r["candidate_bpb"]} for r in rows]}


def reported_markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## The run's own sets", "", "Bits per byte on `eval.report_sets`: reported, never deciding a promotion, "
             "and not checked for overlap with the training data.", "",
             "| set | baseline | candidate | improvement |", "|---|---|---|---|"]
    lines += [f"| {text(r['set'])} | {r['baseline_bpb']:.4f} | {r['candidate_bpb']:.4f} | {r['improvement_bpb']:+.4f} |"
              for r in rows]
    return [*lines, ""]
