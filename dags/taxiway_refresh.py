"""taxiway_refresh: the champion trained further on new data, on a cron or when a batch lands.

**Ways in**: the cron (`refresh.cron`), an asset event on the landing zone (`taxiway land` sends one;
any system can `POST /api/v2/assets/events`; another DAG can name it as an outlet), or *Trigger*
(the form's *Refresh* section holds the refresh's own knobs).

**Stages**: `plan` compares the landed batches with the champion's ledger: nothing new → every later
task is skipped within seconds. Else `assemble` builds the dataset (repeats of trained data dropped,
new data held out) in `<run>/refresh/`, then the same groups as taxiway_train: preflight →
tokenize (new files only, plus replay) → train from the champion → evaluate on the fixed and the new
data → register (the batches in `refresh/ledger.json` on the version).

**Outputs**: the run folder `$TAXIWAY_HOME/runs/<dag id>/<run id>-<hash>/` and the MLflow model version. See
docs/refresh.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable

from taxiway_airflow import failure_summary, stage_groups
from taxiway_airflow.alerts.notifier import RunFailedNotifier
from taxiway_airflow.landing_asset import landing_asset
from taxiway_airflow.params import build_params, default_config_path, form_defaults
from taxiway_airflow.tasks import refresh as tasks

refresh = form_defaults(default_config_path())["refresh"]

with DAG(
    dag_id="taxiway_refresh",
    description="Continue the champion on newly landed data; register it, champion only on a pass",
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable(refresh["cron"], timezone="UTC"),
                                 assets=[landing_asset(refresh["landing"])]),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=failure_summary.CALLBACKS,  # every task: a failure summary in folder, log and note
    on_failure_callback=[failure_summary.dag_failed, RunFailedNotifier()],  # the summary, then the alert on it
    params=build_params(),
    tags=["taxiway", "training", "refresh"],
    doc_md=__doc__,
) as dag:
    run = tasks.refresh_plan.override(task_id="plan")()
    first, _ = stage_groups.all_stages(run)
    tasks.assemble(run) >> first
