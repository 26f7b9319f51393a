"""Airflow's LocalExecutor, whose worker processes start with Taxiway's task imports loaded.

Set ``[core] executor = taxiway_airflow.executors.LocalExecutor`` (the Makefile's ``make airflow``,
``deploy/local``'s live deployments): the scheduler imports ``preload.task_imports`` once, then the
executor forks its workers from it, and every task process a worker's supervisor forks inherits them.
A deployment on Celery gets the same from ``celery_config``. The class keeps Airflow's name, so what
Airflow judges by an executor's class name (the SimpleAuthManager's "is this a local deployment" check)
judges it as the LocalExecutor it is.
"""

from __future__ import annotations

from airflow.executors import local_executor

from taxiway_airflow.preload import task_imports


class LocalExecutor(local_executor.LocalExecutor):
    """Preloads before ``start`` forks the workers; a worker forked again later inherits the same."""

    def start(self) -> None:
        task_imports()
        super().start()
