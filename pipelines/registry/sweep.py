"""A sweep in MLflow: one parent run (keyed by the sweep's run key) and one child run per member
(tag ``mlflow.parentRunId``, keyed by the member's run key), so the MLflow UI nests the members
under the sweep and compares them. Evaluated members are logged in full (params = their config, the
point among them; metrics = their curve and evaluation); a failed member's run (the live run its
training opened, or an empty one) is ended ``FAILED``. Every write looks up what exists first, so a
retried task neither duplicates runs nor fails on what an earlier try wrote."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pipelines.config import RunConfig
from pipelines.registry.client import client, with_retries
from pipelines.registry.runs import RUN_KEY_TAG, _experiment_id, _find_run, log, run_name
from pipelines.run_folder import RunFolder

PARENT_TAG = "mlflow.parentRunId"  # what the MLflow UI nests child runs by
SWEEP_TAG = "taxiway.sweep"        # "parent" on the sweep's run; the member index on a member's


def _parent(c, cfg: RunConfig, run_key: str, airflow: dict[str, str]) -> str:
    exp_id = _experiment_id(c, cfg.name)
    found = _find_run(c, exp_id, run_key)
    if found is not None:
        return found.info.run_id
    tags = {RUN_KEY_TAG: run_key, SWEEP_TAG: "parent", **{f"airflow.{k}": str(v) for k, v in airflow.items()}}
    return c.create_run(exp_id, run_name=f"sweep {run_name(cfg, run_key)}", tags=tags).info.run_id


def _failed_member(c, cfg: RunConfig, row: dict[str, Any]) -> str:
    exp_id = _experiment_id(c, cfg.name)
    found = _find_run(c, exp_id, row["run_key"])
    run_id = (found.info.run_id if found is not None else
              c.create_run(exp_id, run_name=run_name(cfg, row["run_key"]), tags={RUN_KEY_TAG: row["run_key"]}).info.run_id)
    if found is None or found.info.status == "RUNNING":
        c.set_terminated(run_id, status="FAILED")
    c.set_tag(run_id, "taxiway.sweep.failure", row["reason"])
    return run_id


def log_sweep(cfg: RunConfig, run_dir: Path, run_key: str, ranking: dict[str, Any], configs: dict[str, RunConfig],
              airflow: dict[str, str]) -> dict[str, str]:
    """The parent run and every member's child run (``configs``: member index → its config); returns
    ``parent`` and each member index → MLflow run id."""
    from mlflow.entities import Metric, Param  # mlflow (~1 s): DAG parse must not pay for it

    folder = RunFolder(run_dir)
    parent_id = with_retries(cfg.registry, "open the sweep's run", lambda: _parent(client(), cfg, run_key, airflow))
    children: dict[str, str] = {}
    for row in ranking["members"]:
        member_dir = Path(row["run_dir"])
        member_cfg = configs[row["member"]]
        if row["state"] == "evaluated":
            report = json.loads(RunFolder(member_dir).eval_report.read_text())
            children[row["member"]] = log(member_cfg, member_dir, row["run_key"], report, airflow)
        else:
            children[row["member"]] = with_retries(cfg.registry, "end a failed member's run",
                                                   lambda r=row, m=member_cfg: _failed_member(client(), m, r))

    def link() -> None:
        c = client()
        for row in ranking["members"]:
            child = children[row["member"]]
            for key, value in {PARENT_TAG: parent_id, SWEEP_TAG: row["member"], "taxiway.sweep.point":
                               json.dumps(row["point"]), "taxiway.sweep.rank": str(row.get("rank", "failed"))}.items():
                c.set_tag(child, key, value)
        best = next(r for r in ranking["members"] if r["member"] == ranking["best"])
        keys = sorted({k for r in ranking["members"] for k in r["point"]})
        c.log_batch(parent_id, params=[Param("sweep.members", str(len(ranking["members"]))),
                                       Param("sweep.keys", ",".join(keys))],
                    metrics=[Metric("best.eval.candidate.bits_per_byte", float(best["bits_per_byte"]),
                                    int(time.time() * 1000), 0)])
        c.set_tag(parent_id, "taxiway.sweep.best", ranking["best"])
        for path in (folder.sweep_ranking, folder.sweep_ranking_summary, folder.config):
            c.log_artifact(parent_id, str(path), artifact_path="sweep")
        c.set_terminated(parent_id)

    with_retries(cfg.registry, "link the sweep's runs", link)
    return {"parent": parent_id, **children}
