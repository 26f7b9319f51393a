"""Where the MLflow UI is, and which MLflow run belongs to an Airflow run.

The UI's address is not the tracking URI when the store is a database (the embedded default:
``sqlite:///…/mlflow.db``, browsed with ``make mlflow-ui``), so it is looked up in this order:

1. ``TAXIWAY_MLFLOW_UI_URL`` in the api-server's environment;
2. the Airflow connection ``taxiway_mlflow_ui`` (its host, with scheme and port when set);
3. the tracking URI itself when it is a server (``http(s)://…``: the server serves its UI);
4. ``http://127.0.0.1:5000``, where ``make mlflow-ui`` serves the embedded store.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

from airflow.exceptions import AirflowNotFoundException
from airflow.models.connection import Connection

from pipelines.registry.client import client, without_credentials
from pipelines.registry.runs import RUN_KEY_TAG, literal
from pipelines.run_folder import mlflow_tracking_uri
from pipelines.stages.prepare import load_run_config
from taxiway_airflow import mlflow_connection
from taxiway_airflow.runs_view.folder import registry

log = logging.getLogger("taxiway.runs_view")

CONNECTION_ID = "taxiway_mlflow_ui"
EMBEDDED_UI = "http://127.0.0.1:5000"


def _from_connection() -> str | None:
    try:
        conn = Connection.get_connection_from_secrets(CONNECTION_ID)
    except AirflowNotFoundException:
        return None
    if not conn.host:
        return None
    host = conn.host if "://" in conn.host else f"{conn.schema or 'http'}://{conn.host}"
    return f"{host}:{conn.port}" if conn.port else host


def ui_base() -> str:
    """The MLflow UI's address, without a trailing slash. It goes to the browser (a redirect), so it
    carries no credentials: a tracking URI's ``user:password@`` is the workers' to use, not the user's."""
    tracking = mlflow_tracking_uri()
    base = (os.environ.get("TAXIWAY_MLFLOW_UI_URL") or _from_connection()
            or (tracking if tracking.startswith(("http://", "https://")) else EMBEDDED_UI))
    return without_credentials(base).rstrip("/")


def model_version_url(name: str, version: str) -> str:
    return f"{ui_base()}/#/models/{quote(name, safe='')}/versions/{quote(str(version), safe='')}"


def run_url(run_key: str, folder: Path) -> str | None:
    """The MLflow UI's page of the Airflow run ``run_key``'s MLflow run (None before it has one)."""
    found = find_run(run_key, folder)
    return f"{ui_base()}/#/runs/{quote(found, safe='')}" if found else None


def find_run(run_key: str, folder: Path) -> str | None:
    """The MLflow run id of the Airflow run ``run_key``: from ``registry.json`` once registered, else
    the run the training sensor opened (tag ``taxiway.run_key``) in the run's experiment."""
    if run_id := registry(folder).get("run_id"):
        return str(run_id)
    mlflow_connection.apply()  # the api-server logs in to MLflow as the task processes do
    c = client()
    experiment = c.get_experiment_by_name(load_run_config(folder).name)
    if experiment is None:
        return None
    found = c.search_runs([experiment.experiment_id], max_results=1,
                          filter_string=f"tags.`{RUN_KEY_TAG}` = {literal(run_key, 'run key')}")
    return found[0].info.run_id if found else None
