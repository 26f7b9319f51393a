"""The Kubernetes gang's setup and teardown tasks (``TAXIWAY_LAUNCHER=kubernetes``), and the gang's
objects rendered from the run folder, which the operator's Job uses too: built once per try, by
``pipelines.stages.train.render_kubernetes``; every cluster call goes through ``hooks.kubernetes``."""

from __future__ import annotations

import logging
from typing import Any

from airflow.sdk import get_current_context, task

from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.stages import train as train_stage
from taxiway_airflow.failures import translated
from taxiway_airflow.hooks import kubernetes as cluster
from taxiway_airflow.tasks.common import TASK, run_config, run_dir_of

log = logging.getLogger("taxiway")


def render_for_run(run: dict[str, Any], run_id: str, try_number: int) -> tuple[RunConfig, train_stage.Gang]:
    """The run's config and its gang's objects for one try; refuses what the pods could not run."""
    run_dir = run_dir_of(run)
    cfg = run_config(run_dir)
    k = cfg.compute.kubernetes
    if cfg.compute.launcher != "kubernetes":
        raise BadInput(
            f"compute.launcher is {cfg.compute.launcher!r}, but this deployment trains on Kubernetes "
            "(TAXIWAY_LAUNCHER=kubernetes); set compute.launcher: kubernetes")
    if not run_dir.is_relative_to(k.mount_path):
        raise BadInput(
            f"run folder {run_dir} is not under compute.kubernetes.mount_path ({k.mount_path}): the pods "
            "would not find it; mount the volume there on the Airflow workers and set TAXIWAY_HOME to it")
    return cfg, train_stage.render_kubernetes(cfg, run_dir, run_id, try_number)


def create_service(run: dict[str, Any], run_id: str) -> dict[str, str]:
    """Write the trainer spec and create the headless Service that makes rank 0 resolvable (idempotent)."""
    cfg, gang = render_for_run(run, run_id, 1)
    train_stage.spec(cfg, run_dir_of(run))
    hook = cluster.connect(cfg.compute.kubernetes.connection_id)
    if cluster.create_service(hook, gang.namespace, gang.service):
        log.info("created headless Service %s/%s", gang.namespace, gang.service_name)
    else:
        log.info("headless Service %s/%s already exists (a retried setup)", gang.namespace, gang.service_name)
    return {"service": gang.service_name, "namespace": gang.namespace}


def delete_everything(run: dict[str, Any], run_id: str) -> int:
    """Every Job of the run (their pods waited for) and the Service; returns the Jobs deleted."""
    cfg, gang = render_for_run(run, run_id, 1)
    k = cfg.compute.kubernetes
    hook = cluster.connect(k.connection_id)
    jobs = cluster.remove_jobs(hook, gang.namespace, gang.service_name, wait_s=k.termination_grace_s + 60)
    cluster.delete_service(hook, gang.namespace, gang.service_name)
    log.info("deleted %d Job(s) and Service %s/%s; no pod of the gang is left", jobs, gang.namespace,
             gang.service_name)
    return jobs


@task(**TASK)
@translated
def gang_service(run: dict[str, Any]) -> dict[str, str]:
    """Setup: the headless Service of the run's gang."""
    return create_service(run, get_current_context()["run_id"])


@task(**TASK)
@translated
def delete_gang(run: dict[str, Any]) -> dict[str, Any]:
    """Teardown: runs whatever the gang did, so nothing of the run is left in the cluster."""
    return {"jobs_deleted": delete_everything(run, get_current_context()["run_id"])}
