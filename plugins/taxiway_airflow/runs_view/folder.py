"""What the "Training runs" view shows of one run folder, read from the files the stages write.

Every reader tolerates a file that is missing, half-written or malformed (a run that has not got
there yet, or a folder on storage that went away): the view then shows a dash, never an error page.
Reads are bounded whatever a file's size (a long run's ``metrics.jsonl`` passes 40 MB): the loss
curve is ``MAX_POINTS`` points read from at most ``CURVE_BYTES`` of it, spread over the whole run,
and the status history is the newest ``MAX_EVENTS`` events of the last ``EVENTS_BYTES``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.run_folder import RunFolder

MAX_POINTS = 300           # loss points kept for a curve: enough for a plot, small enough for every row
MAX_EVENTS = 200           # newest trainer events on a run's page
CURVE_BYTES = 1 << 20      # most bytes of metrics.jsonl read for a curve
TAIL_BYTES = 64 << 10      # the end of metrics.jsonl, read for the last point and the length of a line
EVENTS_BYTES = 256 << 10   # the end of events.jsonl, read for the newest events


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _records(data: bytes) -> list[dict[str, Any]]:
    out = []
    for line in data.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a torn last line while the trainer appends, or a cut first one
        if isinstance(record, dict):
            out.append(record)
    return out


def _tail(path: Path, limit: int) -> list[dict[str, Any]]:
    """The records in the last ``limit`` bytes of a JSON Lines file (the first, cut line dropped)."""
    try:
        with open(path, "rb", buffering=0) as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size - limit)
            data = os.pread(fh.fileno(), size - start, start)
    except OSError:
        return []
    return _records(data.partition(b"\n")[2] if start else data)


def _point(record: dict[str, Any]) -> tuple[int, float] | None:
    step, loss = record.get("step"), record.get("loss")
    if isinstance(step, int) and isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return step, float(loss)
    return None


def _points(records: list[dict[str, Any]]) -> list[tuple[int, float]]:
    return [p for r in records if (p := _point(r)) is not None]


def losses(path: Path) -> list[tuple[int, float]]:
    """The loss curve of ``metrics.jsonl``, at most ``MAX_POINTS`` points from at most ``CURVE_BYTES``
    read: a short file whole; a long one as the first line at each of evenly spaced offsets (the
    reads sized to hold a whole line, from its tail's longest) and the last point of its tail."""
    try:
        with open(path, "rb", buffering=0) as fh:
            fd, size = fh.fileno(), os.fstat(fh.fileno()).st_size
            if size <= CURVE_BYTES:
                return thinned(_points(_records(os.pread(fd, size, 0))))
            tail = os.pread(fd, TAIL_BYTES, size - TAIL_BYTES).split(b"\n")[1:-1]  # whole lines only
            window = 2 * (max(map(len, tail), default=TAIL_BYTES) + 1)  # holds a whole line wherever it starts
            count = min(MAX_POINTS - 1, (CURVE_BYTES - TAIL_BYTES) // window)
            sampled = [_first_line(os.pread(fd, window, offset), offset)
                       for offset in ((size - TAIL_BYTES) * k // count for k in range(count))] if count else []
    except OSError:
        return []
    points = [p for r in sampled if r is not None and (p := _point(r)) is not None]
    last = _points(_records(b"\n".join(tail)))[-1:]
    return points + [p for p in last if p not in points[-1:]]


def _first_line(data: bytes, offset: int) -> dict[str, Any] | None:
    """The first whole line read at ``offset`` (a line cut at the start is skipped), or None."""
    if offset:
        data = data.partition(b"\n")[2]
    line, newline, _ = data.partition(b"\n")
    records = _records(line) if newline else []
    return records[0] if records else None


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
    ranking = _json(run.sweep_ranking)
    return RunFiles(folder=folder, status=run.read_status(), losses=losses(run.metrics),
                    evaluation=_json(_best_member(ranking, run).eval_report), preflight=_json(run.preflight_report),
                    registry=registry(folder), failure=_json(run.failure_summary),
                    events=_tail(run.events, EVENTS_BYTES)[-MAX_EVENTS:] if with_events else [], ranking=ranking)


def registry(folder: Path) -> dict[str, Any]:
    """What registration recorded (``registry.json``), alone: the MLflow link needs no more."""
    return _json(RunFolder(folder).registry_record)


def _best_member(ranking: dict[str, Any], run: RunFolder) -> RunFolder:
    """A sweep's evaluation is its best member's; any other run's is its own."""
    best = [m for m in ranking.get("members", []) if isinstance(m, dict) and m.get("member") == ranking.get("best")]
    return RunFolder(Path(best[0]["run_dir"])) if best and isinstance(best[0].get("run_dir"), str) else run
