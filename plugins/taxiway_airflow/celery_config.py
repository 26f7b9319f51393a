"""The Celery app config of a Taxiway deployment: Airflow's own, and Taxiway's heavy task imports
preloaded once per Celery worker.

Airflow's worker already preloads what every task imports (``on_celery_import_modules``: "0.3–0.5 s
*per task*"), in its main process, before the pool forks: every task process, forked from there,
inherits the modules copy-on-write. Taxiway's data tasks import far more: Great Expectations and
pandas for the documents check (about 3 s and 270 MB, most of the preflight gate's own time, and
the gate is the one task of the stage that cannot spread over workers), tokenizers and tiktoken for
the tokenize shards, and what the DAG files import (each task process parses its DAG file
again). It also installs ``supervisor_exit`` (a task's end noticed at once, not up
to a heartbeat interval later). Set ``[celery] celery_config_options =
taxiway_airflow.celery_config.CELERY_CONFIG`` (deploy/airflow-values.yaml) and each worker pays
that once, at start-up. torch is left out on purpose: the training tasks are few and long.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import import_modules

CELERY_CONFIG: dict[str, Any] = DEFAULT_CELERY_CONFIG
log = logging.getLogger("taxiway")


@import_modules.connect
def preload(*args: Any, **kwargs: Any) -> None:
    """Sent in the worker's main process only (not the scheduler's, which builds the same app to
    send tasks), beside Airflow's own preload: import, then freeze so the new objects are kept out
    of the collector too (a collection would touch, and so copy, every inherited page)."""
    started = time.monotonic()
    # imported here, not at the top: this preload is the worker's only (the scheduler builds this app too)
    import pandas  # noqa: F401
    import tiktoken  # noqa: F401
    import tokenizers  # noqa: F401

    from pipelines.stages import preflight
    from taxiway_airflow import failure_summary, landing_asset, params, stage_groups, supervisor_exit, sweep_groups  # noqa: F401
    from taxiway_airflow.tasks import land, refresh, sweep, train  # noqa: F401

    preflight.preload()
    exit_wait = supervisor_exit.install()
    gc.freeze()
    log.info("preloaded Great Expectations, pandas, tokenizers, tiktoken and the DAG files' imports in %.1f s; "
             "supervisor exit wait %s", time.monotonic() - started, "installed" if exit_wait else "NOT installed")
