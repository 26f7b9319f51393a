"""taxiway_train: raw text → preflight → tokenize → train → evaluate → register.

Trigger it from the UI form (the config is shown there), or over REST with a partial conf such
as ``{"train": {"lr": 3e-4}}``. Wiring only: every task body lives in ``taxiway_airflow.tasks``.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG, TaskGroup

from pipelines.preflight.report import CHECK_NAMES
from taxiway_airflow import tasks
from taxiway_airflow.operators.gang import TrainGang
from taxiway_airflow.params import build_params
from taxiway_airflow.sensors.checkpoint import CheckpointSensor

# Where the training gang runs is the deployment's choice, fixed when this file is parsed (a DAG's
# shape cannot depend on a run's conf): TAXIWAY_LAUNCHER=local (default) or kubernetes.
LAUNCHER = os.environ.get("TAXIWAY_LAUNCHER", "local")
if LAUNCHER not in ("local", "kubernetes"):
    raise ValueError(f"TAXIWAY_LAUNCHER={LAUNCHER!r}: expected 'local' or 'kubernetes'")

with DAG(
    dag_id="taxiway_train",
    description="Train a GPT from raw text and register it in MLflow with lineage",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    params=build_params(),
    tags=["taxiway", "training"],
    doc_md=__doc__,
) as dag:
    run = tasks.resolve_config()

    with TaskGroup("preflight") as preflight:
        checks = [tasks.preflight_check.override(task_id=name)(name, run) for name in CHECK_NAMES]
        checks >> tasks.preflight_gate.override(task_id="gate")(run)

    with TaskGroup("tokenize") as tokenize:
        tasks.tokenize.override(task_id="pack")(run)

    with TaskGroup("train") as train:
        if LAUNCHER == "kubernetes":  # headless Service (setup) → Indexed Job → teardown: docs/deploy.md
            from taxiway_airflow.operators.kubernetes import training_gang

            service, gang = training_gang(run, retry_delay=timedelta(seconds=10),
                                          max_retry_delay=timedelta(minutes=10))
            final = CheckpointSensor(task_id="final_checkpoint", run=run)
            tasks.smoke.override(task_id="smoke")(run) >> service
            gang >> final
        else:
            gang = TrainGang(task_id="gang", run=run, retries=3, retry_delay=timedelta(seconds=10),
                             retry_exponential_backoff=2.0, max_retry_delay=timedelta(minutes=10))
            final = CheckpointSensor(task_id="final_checkpoint", run=run)
            tasks.smoke.override(task_id="smoke")(run) >> gang >> final

    with TaskGroup("evaluate") as evaluate:
        tasks.evaluate.override(task_id="score")(run)

    with TaskGroup("register") as register:
        tasks.register.override(task_id="model_version")(run)

    preflight >> tokenize >> train >> evaluate >> register
