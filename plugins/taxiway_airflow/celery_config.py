"""The Celery app config of a Taxiway deployment: Airflow's own, and Taxiway's heavy task imports
preloaded once per Celery worker (``preload.task_imports``), before its pool forks task processes. Set
``[celery] celery_config_options = taxiway_airflow.celery_config.CELERY_CONFIG``
(deploy/airflow-values.yaml) and each worker pays that once, at start-up.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import import_modules

from taxiway_airflow.preload import task_imports

CELERY_CONFIG: dict[str, Any] = DEFAULT_CELERY_CONFIG


@import_modules.connect
def preload(*args: Any, **kwargs: Any) -> None:
    """Sent in the worker's main process only, not the scheduler's, which builds the same app to send
    tasks."""
    task_imports()
