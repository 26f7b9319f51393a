"""taxiway_land: land a folder as a new batch of the landing zone, from the trigger form or REST.

The one task names the landing zone's asset as its outlet, so its success is an asset event that
starts ``taxiway_refresh``: the way in for data that another pipeline produces (any DAG with this
outlet does the same). ``source`` must lie inside the data roots; ``batch_id`` defaults to the run's
id. The same as ``taxiway land SRC`` on a shell. See docs/refresh.md.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param

from taxiway_airflow import tasks
from taxiway_airflow.params import default_config_path, form_defaults
from taxiway_airflow.refresh import landing_asset

landing = form_defaults(default_config_path())["refresh"]["landing"]

with DAG(
    dag_id="taxiway_land",
    description="Land a folder as a new data batch; its outlet starts taxiway_refresh",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={
        "source": Param(type="string", minLength=1, title="Folder to land",
                        description="A folder on the workers holding train/ (and optionally val/), inside the data roots"),
        "batch_id": Param(None, type=["null", "string"], title="Batch id",
                          description="Letters, digits, '.', '_' or '-'; empty = this run's id"),
    },
    tags=["taxiway", "data", "refresh"],
    doc_md=__doc__,
) as dag:
    tasks.land_batch.override(task_id="land", outlets=[landing_asset(landing)])(
        "{{ params.source }}", "{{ params.batch_id or '' }}")
