"""The progress line a watcher logs: a relaunch that trained no step yet still shows the real loss."""

from __future__ import annotations

import json
from pathlib import Path

from pipelines import stages


def test_progress_line_falls_back_to_the_last_logged_metrics(tmp_path: Path):
    (tmp_path / "status.json").write_text(json.dumps(
        {"state": "succeeded", "step": 30, "total_steps": 30, "loss": None, "tokens_per_s": None}))
    lines = [{"step": s, "loss": 5.0 - s / 10, "tokens_per_s": 1000.0 + s} for s in (10, 20, 30)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 4')
    assert stages.train.progress_line(tmp_path, 12.0) == "succeeded step 30/30 loss 2.0 tokens/s 1030.0 eta 0s"
    (tmp_path / "status.json").write_text(json.dumps(
        {"state": "running", "step": 10, "total_steps": 30, "loss": 4.5, "tokens_per_s": 99.0}))
    assert stages.train.progress_line(tmp_path, 10.0) == "running step 10/30 loss 4.5 tokens/s 99.0 eta 20s"
