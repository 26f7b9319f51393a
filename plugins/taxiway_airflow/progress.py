"""What the training gang's watchers report: one progress line, and new metrics shipped to MLflow.

Called from the trigger while the gang runs and from the task when it ends, so both write the
same line and the MLflow run gets every metric exactly once (the shipped offset is on disk).
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path


def report(gang_json: str, run_id: str) -> str | None:
    """Ship unshipped ``metrics.jsonl`` lines and the restart count; return the progress line."""
    from pipelines import live_metrics, stages
    from pipelines.launch import local

    handle = local.Handle.load(Path(gang_json))
    run_dir = handle.path.parent.parent
    live_metrics.ship(stages.load_run_config(run_dir), run_dir, run_id, restarts=handle.attempt - 1)
    elapsed = time.time() - datetime.fromisoformat(handle.started_at).timestamp()
    line = stages.progress_line(run_dir, elapsed)
    return f"attempt {handle.attempt}: {line}" if line else None
