"""The MLflow tracking server as an Airflow connection type, ``mlflow``: its address and an MLflow user.

The deployment's ``mlflow_default`` (deploy/airflow-values.yaml) may be of this type, with a form of its
own in the UI, or of type ``http``: Taxiway reads the same fields from either. The host is the tracking
URI, or a host name with ``schema`` (http/https) and ``port``; login and password are an MLflow user.
``taxiway_airflow.mlflow_connection`` copies them into each task's environment, where MLflow's client
reads them; no Taxiway code passes a password any other way.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


def tracking_uri(conn: Any) -> str:
    """The connection's tracking URI: its host when that is a URL, else ``schema://host:port``."""
    if "://" in conn.host:
        return conn.host.rstrip("/")
    return f"{conn.schema or 'http'}://{conn.host}" + (f":{conn.port}" if conn.port else "")


def client_env(conn: Any) -> dict[str, str]:
    """The environment MLflow's client reads, from the connection: the tracking URI when it has a host,
    the user and password when given."""
    given = {"MLFLOW_TRACKING_URI": tracking_uri(conn) if conn.host else None,
             "MLFLOW_TRACKING_USERNAME": conn.login, "MLFLOW_TRACKING_PASSWORD": conn.password}
    return {name: value for name, value in given.items() if value}


class MlflowHook(BaseHook):
    """The connection of an MLflow tracking server; ``get_conn`` is the environment MLflow's client reads.
    Its form in the UI (labels, hidden fields) is declared in the provider info, as Airflow 3.2+ asks."""

    conn_name_attr = "mlflow_conn_id"
    default_conn_name = "mlflow_default"  # the name deploy/airflow-values.yaml gives it
    conn_type = "mlflow"
    hook_name = "MLflow tracking server"

    def __init__(self, mlflow_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.mlflow_conn_id = mlflow_conn_id

    def get_conn(self) -> dict[str, str]:
        return client_env(self.get_connection(self.mlflow_conn_id))
