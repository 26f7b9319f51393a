"""What a process that forks task processes imports once, before it forks: Taxiway's heavy task imports.

Airflow's Celery worker already preloads what every task imports (``on_celery_import_modules``: "0.3–0.5 s
*per task*"), and a LocalExecutor's workers are forked from the scheduler, with Airflow imported. Each
task process, forked from there, inherits the modules copy-on-write. Taxiway's data tasks import far
more: Great Expectations and pandas for the documents check (about 3 s and 270 MB, most of the preflight
gate's own time, and the gate is the one task of the stage that cannot spread over workers), tokenizers
and tiktoken for the tokenize shards, and what the DAG files import (each task process parses its DAG
file again, about 0.6 CPU-s). ``task_imports`` also installs ``supervisor_exit`` (a task's end noticed at
once, not up to a heartbeat interval later). Called by each Celery worker (``celery_config``) and by the
LocalExecutor before it forks its workers (``executors``). torch is left out on purpose: the training
tasks are few and long, and a training gang's nodes are processes of their own.
"""

from __future__ import annotations

import gc
import logging
import time

from taxiway_airflow import supervisor_exit

log = logging.getLogger("taxiway")


def task_imports() -> bool:
    """Import, then freeze, so the new objects are kept out of the collector too (a collection would
    touch, and so copy, every inherited page). A preload that fails is logged and skipped, never fatal:
    it is a saving, and the process forking tasks (a scheduler, a Celery worker) must still start;
    each task then imports what it needs itself, and its own log names the same error. True when
    everything was preloaded."""
    started = time.monotonic()
    try:
        import pandas  # noqa: F401
        import tiktoken  # noqa: F401
        import tokenizers  # noqa: F401

        from pipelines.stages import preflight
        from taxiway_airflow import failure_summary, landing_asset, params, stage_groups, sweep_groups  # noqa: F401
        from taxiway_airflow.tasks import land, refresh, sweep, train  # noqa: F401

        preflight.preload()
    except Exception:
        log.exception("preloading Taxiway's task imports failed: each task imports them itself")
        preloaded = False
    else:
        preloaded = True
    exit_wait = supervisor_exit.install()
    gc.freeze()
    log.info("preloaded %s in %.1f s; supervisor exit wait %s",
             "Great Expectations, pandas, tokenizers, tiktoken and the DAG files' imports" if preloaded else "nothing",
             time.monotonic() - started, "installed" if exit_wait else "NOT installed")
    return preloaded
