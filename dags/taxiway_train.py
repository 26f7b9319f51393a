"""taxiway_train: raw text → preflight → tokenize → train → evaluate → register in MLflow.

**Start it** with *Trigger* (the form shows the deployment's config, `TAXIWAY_CONFIG`; change the
fields you need; everything else is under the advanced section as JSON) or over REST with only what
changes: `POST /api/v2/dags/taxiway_train/dagRuns` with `{"conf": {"train": {"lr": 0.0003}}}`.

**Stages** (each task group's Docs say more): `resolve_config` validates the config and writes
`<run>/config.yaml`; `preflight` checks the data; `tokenize` packs it (cached); `train` runs a smoke
test, then the gang; `evaluate` compares with the baseline; `register` logs the MLflow run and the
model version (alias `champion` only on a passed gate).

**Outputs**: the run folder `$TAXIWAY_HOME/runs/<dag id>/<run id>-<hash>/`, and MLflow: experiment = the config's
`name`, registered model = `registry.model_name`. Wiring only: task bodies live in
`taxiway_airflow.tasks.train`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from taxiway_airflow import failure_summary, stage_groups
from taxiway_airflow.params import build_params
from taxiway_airflow.tasks import train as tasks

with DAG(
    dag_id="taxiway_train",
    description="Train a GPT from raw text and register it in MLflow with lineage",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args=failure_summary.CALLBACKS,  # every task: a failure summary in folder, log and note
    on_failure_callback=failure_summary.dag_failed,
    params=build_params(),
    tags=["taxiway", "training"],
    doc_md=__doc__,
) as dag:
    run = tasks.resolve_config()
    first, _ = stage_groups.all_stages(run)
    run >> first
