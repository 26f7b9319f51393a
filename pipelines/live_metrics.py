"""Ship new ``metrics.jsonl`` lines to the pipeline run's MLflow run while training runs.

The trainer never talks to MLflow (pods hold no tracking credentials); the waiting sensor calls
``ship`` each time it wakes, so curves are live in the MLflow UI. The byte offset already shipped
is kept next to the metrics (``train/metrics.shipped.json``, written atomically after MLflow
accepted the batch), so a retried or re-attached sensor continues where the last one stopped and
registration logs only what was never shipped.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from pipelines import atomic
from pipelines.config import RunConfig
from pipelines.run_folder import RunFolder

KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "mfu")


def _offset_path(run_dir: Path) -> Path:
    return RunFolder(run_dir).metrics_shipped


def shipped_offset(run_dir: Path) -> int:
    try:
        return int(json.loads(_offset_path(run_dir).read_text())["offset"])
    except FileNotFoundError:
        return 0


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
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(key, float(rec[key]),
                   int(datetime.fromisoformat(rec["time"]).timestamp() * 1000) if rec.get("time") else now,
                   int(rec["step"]))
            for rec in records for key in KEYS if rec.get(key) is not None]


def ship(cfg: RunConfig, run_dir: Path, run_key: str, restarts: int | None = None) -> int:
    """Log unshipped metric lines (and the restart count) to the run's MLflow run; returns lines shipped."""
    from pipelines import registry

    records, offset = new_records(run_dir)
    if not records and restarts is None:
        return 0
    c = registry.client()
    run_id = registry.open_run(c, cfg, run_key)
    metrics = to_metrics(records)
    for i in range(0, len(metrics), 500):
        c.log_batch(run_id, metrics=metrics[i:i + 500])
    if restarts is not None:
        c.set_tag(run_id, "taxiway.restarts", str(restarts))
    if records:
        atomic.write_json(_offset_path(run_dir), {"offset": offset})
    return len(records)
