"""What the "Training runs" view shows of one run folder, read from the files the stages write.

Every reader tolerates a file that is missing, half-written or malformed (a run that has not got
there yet, or a folder on storage that went away): the view then shows a dash, never an error page.
Reads are bounded: the loss curve is thinned to ``MAX_POINTS`` and the status history keeps the
newest ``MAX_EVENTS`` events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.run_folder import RunFolder

MAX_POINTS = 300   # loss points kept for a curve: enough for a plot, small enough for every row
MAX_EVENTS = 200   # newest trainer events on a run's page


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line while the trainer appends
        if isinstance(record, dict):
            out.append(record)
    return out


def thinned(points: list[tuple[int, float]], limit: int = MAX_POINTS) -> list[tuple[int, float]]:
    """Every k-th point so at most ``limit`` remain; the last point is always kept."""
    if len(points) <= limit:
        return points
    step = -(-len(points) // limit)
    kept = points[::step]
    return kept if kept[-1] == points[-1] else [*kept[:limit - 1], points[-1]]


@dataclass(frozen=True)
class RunFiles:
    """One run folder as the view needs it."""

    folder: Path
    status: dict[str, Any] = field(default_factory=dict)
    losses: list[tuple[int, float]] = field(default_factory=list)
    evaluation: dict[str, Any] = field(default_factory=dict)
    preflight: dict[str, Any] = field(default_factory=dict)
    registry: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, Any] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    ranking: dict[str, Any] = field(default_factory=dict)  # a sweep's (taxiway_sweep)

    @property
    def progress(self) -> float | None:
        """Share of the training steps done, 0..1 (None before the trainer wrote a status)."""
        step, total = self.status.get("step"), self.status.get("total_steps")
        if not isinstance(step, int) or not isinstance(total, int) or total <= 0:
            return None
        return min(1.0, step / total)

    @property
    def decision(self) -> str | None:
        """The eval gate's word: ``passed``/``failed`` (None before evaluation)."""
        if "passed" not in self.evaluation:
            return None
        return "passed" if self.evaluation["passed"] else "failed"


def read(folder: Path, with_events: bool = False) -> RunFiles:
    """The run folder's files that the view shows; ``with_events`` for a run's own page."""
    run = RunFolder(folder)
    losses = [(int(r["step"]), float(r["loss"])) for r in _jsonl(run.metrics)
              if isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))]
    ranking = _json(run.sweep_ranking)
    return RunFiles(folder=folder, status=run.read_status(), losses=thinned(losses),
                    evaluation=_json(_best_member(ranking, run).eval_report), preflight=_json(run.preflight_report),
                    registry=_json(run.registry_record), failure=_json(run.failure_summary),
                    events=_jsonl(run.events)[-MAX_EVENTS:] if with_events else [], ranking=ranking)


def _best_member(ranking: dict[str, Any], run: RunFolder) -> RunFolder:
    """A sweep's evaluation is its best member's; any other run's is its own."""
    best = [m for m in ranking.get("members", []) if isinstance(m, dict) and m.get("member") == ranking.get("best")]
    return RunFolder(Path(best[0]["run_dir"])) if best and isinstance(best[0].get("run_dir"), str) else run
