"""The Kubernetes gang's setup and teardown tasks (``TAXIWAY_LAUNCHER=kubernetes``), and the run's
launch and launcher, which the operator's Job uses too: the ``LaunchSpec`` of one try and a
``KubernetesLauncher`` whose every cluster call goes through ``hooks.kubernetes``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow.sdk import get_current_context, task

from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.launch.k8s import Gang
from pipelines.launch.launchers import KubernetesLauncher
from pipelines.launch.spec import LaunchSpec, launch_spec
from pipelines.stages import train as train_stage
from pipelines.sweep import members as sweep_members
from taxiway_airflow.failures import translated
from taxiway_airflow.hooks import kubernetes as cluster
from taxiway_airflow.tasks.common import TASK, run_config, run_dir_of

log = logging.getLogger("taxiway")


def gang_name(run: dict[str, Any], run_id: str) -> str:
    """The gang's identity on the cluster (its Service and Job names): the Airflow run id, with a sweep
    member's index, so the members of one sweep run side by side."""
    return run_id if "member" not in run else sweep_members.member_key(run_id, int(run_dir_of(run).name))


def launch_for_run(run: dict[str, Any], run_id: str, try_number: int) -> tuple[RunConfig, LaunchSpec]:
    """The run's config and one try's launch; refuses what the pods could not run."""
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
    return cfg, launch_spec(cfg, run_dir, gang_name(run, run_id), try_number)


def launcher(cfg: RunConfig, hook: Any = None, make_job: Callable[[Gang], Any] | None = None) -> KubernetesLauncher:
    """The run's Kubernetes launcher, through ``hook`` (the connection ``compute.kubernetes.connection_id``'s
    by default)."""
    k = cfg.compute.kubernetes
    return KubernetesLauncher(cluster.HookCluster(hook or cluster.connect(k.connection_id), make_job), k)


def create_service(run: dict[str, Any], run_id: str) -> dict[str, str]:
    """Write the trainer spec and create the headless Service that makes rank 0 resolvable (idempotent)."""
    cfg, launch = launch_for_run(run, run_id, 1)
    spec = train_stage.spec(cfg, run_dir_of(run), launch.name)
    made = launcher(cfg)
    gang = made.render(spec)
    if made.open(spec):
        log.info("created headless Service %s/%s", gang.namespace, gang.service_name)
    else:
        log.info("headless Service %s/%s already exists (a retried setup)", gang.namespace, gang.service_name)
    return {"service": gang.service_name, "namespace": gang.namespace}


def delete_everything(run: dict[str, Any], run_id: str) -> int:
    """Every Job of the run (their pods waited for) and the Service; returns the Jobs deleted."""
    cfg, spec = launch_for_run(run, run_id, 1)
    made = launcher(cfg)
    return made.finish(made.handle(spec))


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
