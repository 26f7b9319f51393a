"""taxiway_sweep: one config, several points of a hyperparameter sweep, trained side by side on one
preflight and one tokenize; the best (val bits/byte) is registered.

**Start it** with *Trigger*: the form is taxiway_train's (the config every member starts from) plus
*Sweep*: a grid over dotted config leaves, `{"train.lr": [0.001, 0.0003], "model.n_layer": [2, 4]}`
(every combination), or a list of points, `[{"train.lr": 0.001}, {"train.lr": 0.0003, "train.steps":
200}]`; 2 to 16 members. Keys under `data`, `preflight`, `tokenizer`, `pack`, `eval`, `parent`, `name`
and `registry` are refused: every member shares those stages. REST: `POST
/api/v2/dags/taxiway_sweep/dagRuns` with `{"conf": {"sweep": {"train.lr": [0.001, 0.0003]}}}`.

**Stages**: `resolve_config` checks the config and every point against it; `preflight` and `tokenize`
run once; `sweep.members` writes a run folder per point; the mapped `member` group trains and
evaluates each (one map index per member, in parallel); `sweep.rank` ranks the evaluated members
(failed ones are listed; one success is enough); `register` logs every member as a child MLflow run
of the sweep's run and registers only the best (alias `champion` only on a passed gate).

**Compare**: `<run>/sweep/ranking.md` (and `ranking.json`); in MLflow, the experiment = the config's
`name`: expand the sweep's run to see its members, select them and *Compare*. Outputs: the run
folder `$TAXIWAY_HOME/runs/<dag id>/<run id>-<hash>/` with a run folder per member under `sweep/NN/`.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from taxiway_airflow import failure_summary, stage_groups, sweep_groups
from taxiway_airflow.params import build_params, sweep_param
from taxiway_airflow.tasks import sweep as sweep_tasks

with DAG(
    dag_id="taxiway_sweep",
    description="Train several points of a hyperparameter sweep on one dataset; register the best",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args=failure_summary.CALLBACKS,  # every task: a failure summary in folder, log and note
    on_failure_callback=failure_summary.dag_failed,
    params={"sweep": sweep_param(), **build_params()},
    tags=["taxiway", "training", "sweep"],
    doc_md=__doc__,
) as dag:
    run = sweep_tasks.resolve_sweep.override(task_id="resolve_config")()
    first, tokenized = stage_groups.data_stages(run)
    members, _ = sweep_groups.sweep_stages(run)
    run >> first
    tokenized >> members
