"""Tasks of ``taxiway_refresh`` before the stages it shares with ``taxiway_train``: the plan (which
champion, which batches) and the dataset it assembles from them (docs/refresh.md)."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import get_current_context, task
from airflow.sdk.exceptions import AirflowSkipException

from pipelines import run_folder
from pipelines.config import deployment
from pipelines.stages import refresh as refresh_stage
from taxiway_airflow.alerts import refresh as refresh_alerts
from taxiway_airflow.failures import translated
from taxiway_airflow.tasks.common import TASK, conf_config, prepared, run_dir_of

log = logging.getLogger("taxiway")


@task.short_circuit(**TASK)
@translated
def refresh_plan() -> dict[str, Any] | None:
    """Decide what this refresh does: the champion to continue and the landed batches new to it.
    Nothing new (or no champion) → one log line saying why and every later task skipped; else the
    refresh's config in ``<run>/config.yaml``. Either way, the alerts the plan calls for (a batch newly
    quarantined, a champion stale while batches wait). A run whose conf changes any setting tries its
    batches without counting against them: a trigger cannot quarantine a batch."""
    ctx = get_current_context()
    run_dir = run_folder.run_dir(ctx["dag"].dag_id, ctx["run_id"])
    conf = ctx["dag_run"].conf or {}
    cfg = conf_config(conf)
    shaped = cfg.model_dump() != deployment.config().model_dump()  # a trigger changed a setting
    decision = refresh_stage.plan(cfg, run_dir, ctx["run_id"], counts=not shaped)
    log.info("%s", decision.reason)
    refresh_alerts.after_plan(cfg, run_dir, ctx["dag"].dag_id, ctx["run_id"])  # quarantined batches, a stale champion
    return None if decision.config is None else prepared(decision.config, run_dir)


@task(**TASK)
@translated
def assemble(run: dict[str, Any]) -> dict[str, Any]:
    """The refresh's dataset: new train files without repeats of trained data, the fixed val set,
    the held-out new files."""
    try:
        summary = refresh_stage.assemble(run_dir_of(run))
    except refresh_stage.NothingNew as exc:  # every later task is skipped, as when the plan finds nothing new
        log.info("%s", exc)
        raise AirflowSkipException(str(exc)) from None
    for batch in summary["batches"]:
        log.info("batch %s: %d train file(s), %d held out (from %s), %d document(s) dropped as repeats of trained "
                 "data%s", batch["batch"], batch["train_files"], batch["held_out_files"], batch["held_out_from"],
                 len(batch["dropped_documents"]),
                 "".join(f"\n  {d['document']} repeats {d['repeats']} (Jaccard ~{d['jaccard']})"
                         for d in batch["dropped_documents"]))
    return {"train_files": summary["train_files"], "fresh_files": summary["fresh_files"],
            "dropped_documents": summary["dropped_documents"]}
