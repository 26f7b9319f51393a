"""taxiway_land: land a folder as a new batch of the landing zone, from the trigger form or REST.

**Start it** with *Trigger* (*Folder to land*, inside the data roots; *Batch id*, empty = this run's
id) or `POST /api/v2/dags/taxiway_land/dagRuns` with `{"conf": {"source": "/data/incoming/news"}}`.
The same as `taxiway land SRC` on a shell.

**Outputs**: `<refresh.landing>/<batch id>/` with the files, their manifest and, written last, the
completion marker. The task's outlet is the landing zone's asset, so its success starts
taxiway_refresh (any DAG with this outlet does the same). See docs/refresh.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from taxiway_airflow.landing_asset import landing_asset
from taxiway_airflow.params import default_config_path, form_defaults, param
from taxiway_airflow.tasks.land import land_batch

landing = form_defaults(default_config_path())["refresh"]["landing"]

with DAG(
    dag_id="taxiway_land",
    description="Land a folder as a new data batch; its outlet starts taxiway_refresh",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "source": param(type="string", minLength=1, maxLength=4096, title="Folder to land",
                        description="A folder on the workers holding train/ (and optionally val/), inside the data roots"),
        "batch_id": param(None, type=["null", "string"], maxLength=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                          title="Batch id",
                          description="Letters, digits, '.', '_' or '-'; empty = this run's id"),
    },
    tags=["taxiway", "data", "refresh"],
    doc_md=__doc__,
) as dag:
    land_batch.override(task_id="land", outlets=[landing_asset(landing)])(
        "{{ params.source }}", "{{ params.batch_id or '' }}")
