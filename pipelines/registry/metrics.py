"""The trainer's ``metrics.jsonl`` as MLflow metrics, and how much of it MLflow already has.

The trainer never talks to MLflow (pods hold no tracking credentials); the waiting sensor ships
new lines each time it wakes (``runs.ship``), so curves are live in the MLflow UI. The byte offset
already shipped is kept next to the metrics (``train/metrics.shipped.json``, written atomically
after MLflow accepted the batch), so a retried or re-attached sensor continues where the last one
stopped and registration logs only what was never shipped. No MLflow client here.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines.run_folder import RunFolder
from trainer import fsio

KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")


def _offset_path(run_dir: Path) -> Path:
    return RunFolder(run_dir).metrics_shipped


def shipped_offset(run_dir: Path) -> int:
    try:
        return int(json.loads(_offset_path(run_dir).read_text())["offset"])
    except FileNotFoundError:
        return 0


def mark_shipped(run_dir: Path, offset: int) -> None:
    """Record that MLflow accepted every line before byte ``offset``."""
    fsio.write_json(_offset_path(run_dir), {"offset": offset})


def new_records(run_dir: Path, start: int | None = None) -> tuple[list[dict[str, Any]], int]:
    """Complete lines after byte ``start`` (default: the shipped offset), and the offset after them
    (a torn last line waits)."""
    path = RunFolder(run_dir).metrics
    if not path.exists():
        return [], 0
    start = shipped_offset(run_dir) if start is None else start
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read()
    complete = data[:data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], start + len(complete)


def last_record(run_dir: Path, tail_bytes: int = 65536) -> dict[str, Any]:
    """The newest complete line of ``metrics.jsonl`` with a loss ({} when there is none)."""
    path = RunFolder(run_dir).metrics
    if not path.exists():
        return {}
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - tail_bytes))
        lines = fh.read().split(b"\n")
    for line in reversed(lines[1:] if size > tail_bytes else lines):  # a cut first line, a torn last one: skipped
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("loss") is not None:
            return record
    return {}


def to_metrics(records: list[dict[str, Any]]) -> list:
    """MLflow ``Metric``s at the trainer's own UTC timestamps and steps."""
    from mlflow.entities import Metric  # mlflow (~1 s): DAG parse must not pay for it

    now = int(time.time() * 1000)
    return [Metric(key, float(rec[key]),
                   int(datetime.fromisoformat(rec["time"]).timestamp() * 1000) if rec.get("time") else now,
                   int(rec["step"]))
            for rec in records for key in KEYS if rec.get(key) is not None]


def forgetting(report: dict[str, Any]) -> dict[str, float]:
    """A refresh's forgetting rows (``eval.report.with_forgetting``) as metric names and values:
    ``eval.forgetting.fixed.*`` and ``eval.forgetting.batch.<id>.*``; none for a run that is not a refresh."""
    out: dict[str, float] = {}
    for row in report.get("forgetting", {}).get("sets", []):
        where = f"batch.{row['batch']}" if row["batch"] else "fixed"
        for key in ("parent_bpb", "candidate_bpb", "delta_bpb"):
            out[f"eval.forgetting.{where}.{key}"] = float(row[key])
    return out
