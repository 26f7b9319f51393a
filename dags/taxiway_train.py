"""taxiway_train: raw text → preflight → tokenize → train → evaluate → register.

Trigger it from the UI form (the config is shown there), or over REST with a partial conf such
as ``{"train": {"lr": 3e-4}}``. Wiring only: every task body lives in ``taxiway_airflow.tasks``.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from taxiway_airflow import failure_summary, pipeline, tasks
from taxiway_airflow.params import build_params

with DAG(
    dag_id="taxiway_train",
    description="Train a GPT from raw text and register it in MLflow with lineage",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    default_args=failure_summary.CALLBACKS,  # every task: a failure summary in folder, log and note
    on_failure_callback=failure_summary.dag_failed,
    params=build_params(),
    tags=["taxiway", "training"],
    doc_md=__doc__,
) as dag:
    run = tasks.resolve_config()
    first, _ = pipeline.stages(run)
    run >> first
