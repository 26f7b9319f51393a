"""The sweep's registration stage: every member logged as a child MLflow run of the sweep's run,
then only the best member registered as a model version, through the same ``register`` stage a
single run uses (champion gate, re-evaluation when the champion moved, ``challenger`` otherwise)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelines import stages
from pipelines.registry import sweep as mlflow_sweep
from pipelines.run_folder import RunFolder
from trainer import fsio


def register(run_dir: Path, run_key: str, airflow: dict[str, str] | None = None) -> dict[str, Any]:
    """Log the sweep to MLflow and register its best member; writes ``registry.json`` in the sweep's
    run folder (what the member's own says, plus the member and the parent run). Idempotent per run key."""
    folder = RunFolder(run_dir)
    if not folder.sweep_ranking.exists():
        raise stages.prepare.StageInputError(f"{folder.sweep_ranking}: missing; run the sweep's 'rank' task first")
    ranking = json.loads(folder.sweep_ranking.read_text())
    configs = {r["member"]: stages.prepare.load_run_config(Path(r["run_dir"])) for r in ranking["members"]}
    runs = mlflow_sweep.log_sweep(stages.prepare.load_run_config(run_dir), run_dir, run_key, ranking, configs, airflow or {})
    best = next(r for r in ranking["members"] if r["member"] == ranking["best"])
    result = stages.register.run(configs[best["member"]], Path(best["run_dir"]), best["run_key"], airflow)
    record = {**result, "sweep_member": best["member"], "sweep_point": best["point"], "parent_run_id": runs["parent"],
              "run_dir": best["run_dir"]}  # the member's folder: where an approval reads and decides
    fsio.write_json(folder.registry_record, record)
    return record
