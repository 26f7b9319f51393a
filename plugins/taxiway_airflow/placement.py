"""Where a task runs and what bounds it, as the deployment says in Airflow's ``[taxiway]`` section
(``AIRFLOW__TAXIWAY__…``; the provider info documents them: ``get_provider_info.CONFIG``).

- ``gpu_queue``: the queue of the tasks that need the training worker (a GPU, or the memory of a big
  worker): the smoke test, the local gang and the evaluation. Empty (the default): Airflow's default
  queue, as before. A CeleryExecutor deployment that sets it runs workers listening on it
  (``airflow celery worker --queues <gpu_queue>``); the LocalExecutor and ``dag.test()`` ignore queues.
- ``registry_pool``: the pool of the tasks that write to the model registry (registration and the
  approval's decision). Empty (the default): Airflow's ``default_pool``. A pool that does not exist
  holds its tasks in ``scheduled`` for ever (the scheduler only logs "Tasks using non-existent pool"),
  so the deployment creates it first (``airflow pools set <name> <slots> <description>``).

- ``gang_retry_delay_s``: how long a failed or stalled gang's task waits before its retry relaunches
  it (doubling on each retry, at most 10 minutes): time for a lost node to come back or be replaced.

All are read when a DAG file is parsed: a task's queue, pool and retries are part of the DAG's shape.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk.configuration import conf

SECTION = "taxiway"
GPU_QUEUE, REGISTRY_POOL, GANG_RETRY_DELAY = "gpu_queue", "registry_pool", "gang_retry_delay_s"
GANG_RETRY_DELAY_S = 10.0


def _setting(key: str) -> str:
    return conf.get(SECTION, key, fallback="").strip()


def gpu_work() -> dict[str, Any]:
    """Operator arguments of a task that needs the training worker: ``queue`` when the deployment names one."""
    queue = _setting(GPU_QUEUE)
    return {"queue": queue} if queue else {}


def registry_work() -> dict[str, Any]:
    """Operator arguments of a task that writes to the model registry: ``pool`` when the deployment names one."""
    pool = _setting(REGISTRY_POOL)
    return {"pool": pool} if pool else {}


def gang_retries() -> dict[str, Any]:
    """Operator arguments of a training gang's task: three retries, each relaunching from the newest valid
    checkpoint after ``gang_retry_delay_s``, doubled per retry up to 10 minutes."""
    delay = conf.getfloat(SECTION, GANG_RETRY_DELAY, fallback=GANG_RETRY_DELAY_S)
    if not 0 <= delay <= 600:
        raise ValueError(f"[{SECTION}] {GANG_RETRY_DELAY} = {delay:g}: expected seconds from 0 to 600")
    return {"retries": 3, "retry_delay": timedelta(seconds=delay), "retry_exponential_backoff": 2.0,
            "max_retry_delay": timedelta(minutes=10)}
