"""MLflow's address and credentials for a task process, from the Airflow connection ``mlflow_default``.

The production tracking server requires a login (deploy/base/mlflow.yaml: ``--app-name basic-auth``).
MLflow's client takes it from ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD`` only, and a
plain env value would put the password in the Helm values and the pod spec. So the deployment gives
it as a connection (type ``mlflow``, Taxiway's own: ``hooks/mlflow.py``, or ``http``; host = the tracking
URI, or a host name with ``schema`` http/https and ``port``; login/password = an MLflow user), from a
Kubernetes Secret, and this step copies it into the
environment of the one process that needs it, as each task starts (``on_task_instance_running``,
registered by the Taxiway plugin). Airflow masks the connection's password in task logs; nothing
here logs a value. A deployment opts in by naming the connection in ``TAXIWAY_MLFLOW_LOGIN_CONN_ID``
(deploy/airflow-values.yaml): without it (the embedded default, a server without auth) nothing is
looked up, so no other DAG's task pays a connection lookup for it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from airflow.listeners import hookimpl
from airflow.sdk import Connection
from airflow.sdk.exceptions import AirflowNotFoundException

from taxiway_airflow.hooks.mlflow import MlflowHook, client_env

log = logging.getLogger("taxiway")

CONNECTION_ID = MlflowHook.default_conn_name  # the name deploy/airflow-values.yaml gives it
CONNECTION_ENV = "TAXIWAY_MLFLOW_LOGIN_CONN_ID"


def apply(quiet: bool = False) -> bool:
    """Set MLflow's tracking env vars from the connection named by ``TAXIWAY_MLFLOW_LOGIN_CONN_ID``;
    False (env untouched) when none is named or it does not exist. ``quiet``: no log line (the
    triggerer applies it before each metrics report)."""
    conn_id = os.environ.get(CONNECTION_ENV)
    if not conn_id:
        return False
    try:
        conn = Connection.get(conn_id)
    except AirflowNotFoundException:
        return False
    given = client_env(conn)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        if name not in given:  # a login the connection no longer gives (the triggerer's process lives on)
            os.environ.pop(name, None)
    os.environ.update(given)
    if not quiet:
        log.info("MLflow tracking settings from the Airflow connection %s: %s", conn_id, ", ".join(given) or "none")
    return True


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    """Before the task runs, in its own process: the task's MLflow client sees the connection."""
    apply()
