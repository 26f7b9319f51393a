"""Taxiway as an Airflow provider: what ``airflow providers`` lists and the connection form offers.

The package's ``apache_airflow_provider`` entry point (pyproject.toml) names ``get_provider_info``;
Airflow calls it in every process that discovers providers and checks the dict against its
``provider_info.schema.json`` (tests/test_provider.py does too). It imports nothing but the standard
library: the modules it names are imported only when something asks for them.

The views are not here: they are the plugin ``taxiway_airflow.plugin`` (its own entry point; see there).
"""

from __future__ import annotations

import copy
from importlib.metadata import PackageNotFoundError, version
from typing import Any

PACKAGE = "taxiway"  # the distribution's name (pyproject.toml): Airflow requires package-name to equal it

# Airflow's [taxiway] section. Airflow loads these defaults into its config, so each equals the
# fallback of the code that reads it (tests/test_provider.py holds them equal).
CONFIG: dict[str, Any] = {
    "taxiway": {
        "description": "Taxiway's deployment settings: the pace of a run's waiting, and where its tasks run.",
        "options": {
            "min_event_delay_s": {
                "description": "The least time, in seconds, a training gang's trigger waits before it fires: "
                               "Airflow 3.3 fails a resumed task whose trigger fired before the deferring "
                               "try's exit was processed (apache/airflow#72716).",
                "version_added": "0.1.0", "type": "float", "example": "2", "default": "10.0",
            },
            "checkpoint_poke_s": {
                "description": "How often, in seconds, the final_checkpoint sensor looks for the exported "
                               "model (rescheduled between pokes: it holds no worker slot).",
                "version_added": "0.1.0", "type": "float", "example": "1", "default": "5.0",
            },
            "gang_retry_delay_s": {
                "description": "How long, in seconds, a failed or stalled training gang's task waits before "
                               "its retry relaunches the gang from the newest valid checkpoint; doubled on each "
                               "retry, at most 10 minutes. Read when DAG files are parsed.",
                "version_added": "0.1.0", "type": "float", "example": "30", "default": "10.0",
            },
            "gpu_queue": {
                "description": "The executor queue of the tasks that need the training worker (a GPU, or "
                               "a big worker's memory): the smoke test, the local gang, the evaluation. "
                               "Empty: Airflow's default queue. Read when DAG files are parsed; with the "
                               "CeleryExecutor a worker must listen on it (airflow celery worker --queues).",
                "version_added": "0.1.0", "type": "string", "example": "gpu", "default": "",
            },
            "registry_pool": {
                "description": "The pool of the tasks that write to the model registry (registration, "
                               "the approval's decision). Empty: default_pool. Read when DAG files are "
                               "parsed; the pool must exist (airflow pools set NAME SLOTS DESCRIPTION) "
                               "or the scheduler never queues those tasks.",
                "version_added": "0.1.0", "type": "string", "example": "taxiway_registry", "default": "",
            },
        },
    },
}


def _version() -> str:
    try:
        return version(PACKAGE)
    except PackageNotFoundError:  # imported from the plugins folder of an Airflow that did not install it
        return "0+unknown"


def get_provider_info() -> dict[str, Any]:
    """A new dict on each call: Airflow adds to the one it gets."""
    return {
        "package-name": PACKAGE,
        "name": "Taxiway",
        "description": "Train a language model from raw text to an evaluated model registered in MLflow: "
                       "operators, triggers and a sensor for training gangs (local or Kubernetes), "
                       "human approval of a registration, and the MLflow connection.",
        "versions": [_version()],
        "integrations": [
            {"integration-name": "Taxiway", "tags": ["software"]},
            {"integration-name": "MLflow", "external-doc-url": "https://mlflow.org/docs/latest/", "tags": ["software"]},
        ],
        "operators": [{"integration-name": "Taxiway", "python-modules": [
            "taxiway_airflow.operators.gang",
            "taxiway_airflow.operators.kubernetes",
            "taxiway_airflow.operators.approval",
        ]}],
        "sensors": [{"integration-name": "Taxiway", "python-modules": ["taxiway_airflow.sensors.checkpoint"]}],
        "hooks": [
            {"integration-name": "Taxiway", "python-modules": ["taxiway_airflow.hooks.kubernetes"]},
            {"integration-name": "MLflow", "python-modules": ["taxiway_airflow.hooks.mlflow"]},
        ],
        "triggers": [{"integration-name": "Taxiway", "python-modules": [
            "taxiway_airflow.triggers.gang",
            "taxiway_airflow.triggers.kubernetes",
            "taxiway_airflow.triggers.approval",
        ]}],
        "connection-types": [{
            "connection-type": "mlflow",
            "hook-class-name": "taxiway_airflow.hooks.mlflow.MlflowHook",
            "hook-name": "MLflow tracking server",
            "ui-field-behaviour": {
                "hidden-fields": ["extra"],
                "relabeling": {"host": "Tracking URI or host", "schema": "Scheme (http or https)",
                               "login": "MLflow user"},
                "placeholders": {"host": "http://mlflow.taxiway.svc.cluster.local:5000", "schema": "http",
                                 "port": "5000"},
            },
        }],
        "notifications": ["taxiway_airflow.alerts.notifier.RunFailedNotifier"],
        "config": copy.deepcopy(CONFIG),
    }
