"""The members ranked by the metric the champion gate judges: the candidate's bits per byte on the
shared val split (lower is better). A member without an evaluation report failed (at smoke,
training or evaluation) and is listed as failed; the sweep goes on when at least one was evaluated."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines.errors import CheckFailed
from pipelines.run_folder import RunFolder
from pipelines.sweep import members
from trainer import fsio

METRIC = "bits_per_byte"  # eval/report.json candidate.bits_per_byte: what the gate's improvement is in


class NoMemberEvaluated(CheckFailed):
    """Every member of the sweep failed before its evaluation report."""


def _row(member: dict[str, Any]) -> dict[str, Any]:
    folder = RunFolder(Path(member["run_dir"]))
    base = {k: member[k] for k in ("member", "point", "run_dir", "run_key")}
    if not folder.eval_report.exists():
        state = folder.read_status().get("state") or "never started"
        return {**base, "state": "failed", "reason": f"no evaluation report (trainer state: {state})"}
    report = json.loads(folder.eval_report.read_text())
    c = report["candidate"]
    return {**base, "state": "evaluated", METRIC: c[METRIC], "loss": c["loss"], "perplexity": c["perplexity"],
            "gate_passed": report["passed"], "improvement_bpb": report["improvement_bpb"],
            "baseline": report["baseline"]["label"]}


def rank(run_dir: Path) -> dict[str, Any]:
    """``sweep/ranking.json`` and ``ranking.md`` (written atomically); fails when no member was evaluated."""
    folder = RunFolder(run_dir)
    rows = [_row(m) for m in members.read(run_dir)]
    evaluated = sorted((r for r in rows if r["state"] == "evaluated"), key=lambda r: (r[METRIC], r["member"]))
    failed = [r for r in rows if r["state"] != "evaluated"]
    for place, row in enumerate(evaluated, 1):
        row["rank"] = place
    if not evaluated:
        why = "; ".join(f"{r['member']}: {r['reason']}" for r in failed)
        raise NoMemberEvaluated(f"no member of the sweep was evaluated: {why}")
    ranking = {"metric": f"candidate {METRIC} on the shared val split (lower is better)",
               "best": evaluated[0]["member"], "ranked_at": fsio.utc_now(), "members": evaluated + failed}
    fsio.write_json(folder.sweep_ranking, ranking)
    fsio.write_text(folder.sweep_ranking_summary, summary(ranking))
    return ranking


def summary(ranking: dict[str, Any]) -> str:
    """The ranking as a Markdown table, best first, failed members last."""
    lines = ["# Sweep ranking", "", f"Ranked by {ranking['metric']}; best: member {ranking['best']}.", "",
             "| rank | member | point | val bits/byte | gate vs baseline |", "|---|---|---|---|---|"]
    for r in ranking["members"]:
        point = ", ".join(f"`{k}={json.dumps(v)}`" for k, v in r["point"].items())
        if r["state"] == "evaluated":
            gate = f"{'passed' if r['gate_passed'] else 'failed'} ({r['improvement_bpb']:+.4f} vs {r['baseline']})"
            lines.append(f"| {r['rank']} | {r['member']} | {point} | {r[METRIC]:.4f} | {gate} |")
        else:
            lines.append(f"| – | {r['member']} | {point} | failed | {r['reason']} |")
    return "\n".join(lines) + "\n"
