"""Tasks of ``taxiway_sweep``: thin wrappers around ``pipelines.sweep``. A member's
own stages (smoke, gang, evaluation) are the single run's tasks, given the member's run folder."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import get_current_context, task

from pipelines import run_folder
from pipelines.sweep import members as sweep_members
from pipelines.sweep import points, ranking, registration
from taxiway_airflow import intake
from taxiway_airflow.failures import translated
from taxiway_airflow.tasks.common import TASK, held_to_roots, prepared, run_dir_of

log = logging.getLogger("taxiway")


@task(**TASK)
@translated
def resolve_sweep() -> dict[str, Any]:
    """Config as ``resolve_config`` makes it, and the ``sweep`` param checked against it: every point
    must give a valid RunConfig, so a bad key or value fails here (never retried), naming point and key."""
    ctx = get_current_context()
    cfg, chosen = intake.sweep(dict(ctx["dag_run"].conf or {}))
    held_to_roots(cfg)
    run_dir = run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"])
    out = prepared(cfg, run_dir)
    points.write(run_dir, chosen)
    for m in chosen:
        log.info("member %02d: %s (config sha256 %s)", m.index, m.point, m.config.sha256()[:12])
    return out


@task(**TASK)
@translated
def members(run: dict[str, Any]) -> list[dict[str, Any]]:
    """One run folder per point, sharing this run's preflight and packed data; the list is what the
    member task group is mapped over (each item names its member by index; ``run_dir_of`` finds the folder)."""
    ctx = get_current_context()
    out = sweep_members.write(run_dir_of(run), run_folder.run_key(ctx["dag"].dag_id, ctx["run_id"]))
    log.info("%d member run folder(s) under %s", len(out), run_dir_of(run) / "sweep")
    return [{k: m[k] for k in ("member", "point", "name", "config_sha256")} for m in out]  # no path: run_dir_of


@task(**TASK, trigger_rule="all_done_min_one_success")
@translated
def rank() -> dict[str, Any]:
    """Rank the members that were evaluated; runs when every member ended and one at least succeeded
    (its only upstream are the members' last tasks: a sweep that failed earlier leaves it upstream_failed)."""
    ctx = get_current_context()
    result = ranking.rank(run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"]))
    log.info("%s", ranking.summary(result))
    return {"best": result["best"], "members": len(result["members"]),
            "failed": [r["member"] for r in result["members"] if r["state"] != "evaluated"]}


@task(**TASK)
@translated
def register_best(run: dict[str, Any]) -> dict[str, Any]:
    """Every member a child MLflow run of the sweep's run; the best registered. Idempotent per Airflow run."""
    ctx = get_current_context()
    airflow = {"dag_id": ctx["dag"].dag_id, "run_id": ctx["run_id"]}
    result = registration.register(run_dir_of(run), run_folder.run_key(ctx["dag"].dag_id, ctx["run_id"]), airflow)
    log.info("registered member %s as %s version %s ('%s'); MLflow parent run %s", result["sweep_member"],
             result["model_name"], result["version"], result["alias"], result["parent_run_id"])
    return {k: v for k, v in result.items() if k != "run_dir"}  # no path in an XCom: approval_dir() finds it
