"""The training gang on Kubernetes: headless Service (setup) → Indexed Job → delete both (teardown).

Built on the cncf-kubernetes provider's pod-operator family: ``GangJob`` is its
``KubernetesJobOperator`` fed with the objects that ``pipelines.launch.k8s.render`` makes from the
run's config, plus what a training gang needs on top of it:

- **durable**: the Job's name is kept in Airflow 3.3's ``task_state_store`` (``ResumableJobMixin``),
  so a retry after a worker crash re-attaches to the running Job instead of starting a second gang;
- **one gang at a time**: before a new try creates its Job, the Jobs of earlier tries are deleted
  and their pods waited for (SIGTERM → checkpoint), so two gangs never write one run folder;
- **deferrable**: waiting happens in the triggerer; failing or clearing the deferred task deletes
  the Job (``GangJobTrigger.on_kill``), a killed worker does the same (the provider's ``on_kill``).

The deployment picks the launcher when the DAG is parsed (``TAXIWAY_LAUNCHER=kubernetes``; a DAG's
structure cannot depend on a run's conf), and only then does the DAG import this module (the
provider costs about a second of parse time). Pipeline code is imported inside the tasks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.sdk import get_current_context, task
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException, AirflowFailException

log = logging.getLogger("taxiway")

def training_gang(run: Any, **job_kwargs: Any) -> tuple[Any, Any]:
    """Service (setup) → ``GangJob`` → delete Job and Service (teardown), in the caller's task group.

    Returns (first, gang) so the caller chains ``upstream >> first`` and ``gang >> downstream``.
    """
    service = gang_service.override(task_id="service")(run)
    job_kwargs = {"retries": 3, "retry_exponential_backoff": 2.0, **job_kwargs}
    gang = GangJob(task_id="gang", run=run, **job_kwargs)
    teardown = delete_gang.override(task_id="teardown")(run)
    service >> gang >> teardown.as_teardown(setups=service)
    return service, gang


# --- rendering from the run folder ---------------------------------------------------------

def render_for_run(run: dict[str, Any], run_id: str, try_number: int):
    """The run's config → ``pipelines.launch.k8s.Gang``; refuses what the pods could not run."""
    from pipelines import stages
    from pipelines.launch import k8s
    from pipelines.launch.spec import launch_spec
    from pipelines.run_folder import RunFolder

    run_dir = Path(run["run_dir"])
    cfg = stages.load_run_config(run_dir)
    k = cfg.compute.kubernetes
    if cfg.compute.launcher != "kubernetes":
        raise AirflowFailException(
            f"compute.launcher is {cfg.compute.launcher!r}, but this deployment trains on Kubernetes "
            "(TAXIWAY_LAUNCHER=kubernetes); set compute.launcher: kubernetes")
    if not run_dir.is_relative_to(k.mount_path):
        raise AirflowFailException(
            f"run folder {run_dir} is not under compute.kubernetes.mount_path ({k.mount_path}): the pods "
            "would not find it; mount the volume there on the Airflow workers and set TAXIWAY_HOME to it")
    command = launch_spec(cfg, run_dir, RunFolder(run_dir).trainer_spec).trainer_args()
    return cfg, k8s.render(cfg, run_id=run_id, try_number=try_number, command=command)


def _hook(conn_id: str):
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id)


def _ignore_missing(call, *args: Any, **kwargs: Any) -> Any:
    from kubernetes.client.exceptions import ApiException

    try:
        return call(*args, **kwargs)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


def remove_jobs(hook: Any, namespace: str, gang_label: str, wait_s: float) -> int:
    """Delete every Job of this gang (all tries) and wait until their pods are gone; returns Jobs deleted.

    Foreground propagation: pods get SIGTERM and their termination grace period, in which the
    trainer saves a checkpoint.
    """
    from pipelines.launch.k8s import GANG_LABEL

    selector = f"{GANG_LABEL}={gang_label}"
    jobs = hook.batch_v1_client.list_namespaced_job(namespace, label_selector=selector).items
    for job in jobs:
        log.info("deleting Job %s/%s", namespace, job.metadata.name)
        _ignore_missing(hook.batch_v1_client.delete_namespaced_job, job.metadata.name, namespace,
                        propagation_policy="Foreground")
    deadline = time.monotonic() + wait_s
    while pods := hook.core_v1_client.list_namespaced_pod(namespace, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise AirflowException(f"{len(pods)} pod(s) of {selector} still present after {wait_s:.0f}s: "
                                   + ", ".join(p.metadata.name for p in pods))
        time.sleep(2)
    return len(jobs)


# --- setup and teardown ----------------------------------------------------------------------

def create_service(run: dict[str, Any], run_id: str) -> dict[str, str]:
    """Write the trainer spec and create the headless Service that makes rank 0 resolvable (idempotent)."""
    from kubernetes.client.exceptions import ApiException

    from pipelines import stages

    cfg, gang = render_for_run(run, run_id, 1)
    stages.trainer_spec(cfg, Path(run["run_dir"]))
    hook = _hook(cfg.compute.kubernetes.connection_id)
    try:
        hook.core_v1_client.create_namespaced_service(gang.namespace, gang.service)
        log.info("created headless Service %s/%s", gang.namespace, gang.service_name)
    except ApiException as exc:
        if exc.status != 409:
            raise
        log.info("headless Service %s/%s already exists (a retried setup)", gang.namespace, gang.service_name)
    return {"service": gang.service_name, "namespace": gang.namespace}


def delete_everything(run: dict[str, Any], run_id: str) -> int:
    """Every Job of the run (their pods waited for) and the Service; returns the Jobs deleted."""
    cfg, gang = render_for_run(run, run_id, 1)
    k = cfg.compute.kubernetes
    hook = _hook(k.connection_id)
    jobs = remove_jobs(hook, gang.namespace, gang.service_name, wait_s=k.termination_grace_s + 60)
    _ignore_missing(hook.core_v1_client.delete_namespaced_service, gang.service_name, gang.namespace)
    log.info("deleted %d Job(s) and Service %s/%s; no pod of the gang is left", jobs, gang.namespace,
             gang.service_name)
    return jobs


@task(retries=2)
def gang_service(run: dict[str, Any]) -> dict[str, str]:
    """Setup: the headless Service of the run's gang."""
    return create_service(run, get_current_context()["run_id"])


@task(retries=2)
def delete_gang(run: dict[str, Any]) -> dict[str, Any]:
    """Teardown: runs whatever the gang did, so nothing of the run is left in the cluster."""
    return {"jobs_deleted": delete_everything(run, get_current_context()["run_id"])}


# --- the Job ---------------------------------------------------------------------------------

class GangJobTrigger(KubernetesJobTrigger):
    """The provider's Job trigger, plus: a user failing or clearing the deferred task deletes the Job."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def on_kill(self) -> None:
        hook = _hook(self.kubernetes_conn_id)
        await asyncio.to_thread(_ignore_missing, hook.batch_v1_client.delete_namespaced_job, self.job_name,
                                self.job_namespace, propagation_policy="Foreground")


class GangJob(ResumableJobMixin, KubernetesJobOperator):
    """``KubernetesJobOperator`` running the training gang as an Indexed Job rendered from the run's config."""

    template_fields = (*KubernetesJobOperator.template_fields, "run")
    external_id_key = "taxiway_k8s_job"
    ui_color = "#e4f0ff"

    def __init__(self, *, run: Any, pods_timeout_s: float = 120.0, **kwargs: Any) -> None:
        kwargs = {"deferrable": True, "job_poll_interval": 30, "get_logs": True, **kwargs}
        super().__init__(completion_mode="Indexed", backoff_limit=0, wait_until_job_complete=True,
                         random_name_suffix=False, do_xcom_push=False, **kwargs)
        self.run = run
        self.pods_timeout_s = pods_timeout_s
        self.gang = None

    def adopt(self, gang: Any, connection_id: str) -> None:
        """Take the rendered Job as this operator's job and pod spec (what ``build_job_request_obj`` reads).

        The pod spec goes in ``full_pod_spec`` only: the provider appends list fields (env, volumes)
        of ``full_job_spec``'s template to the pod it builds, so that template carries metadata only.
        """
        from airflow.providers.cncf.kubernetes.operators.job import JOB_NAME_PREFIX
        from kubernetes.client import ApiClient

        from pipelines.launch.k8s import CONTAINER

        api = ApiClient()
        template = gang.job["spec"]["template"]
        job = {**gang.job, "spec": {**gang.job["spec"], "template": {"metadata": template["metadata"]}}}
        self.full_job_spec = api._ApiClient__deserialize(job, "V1Job")
        self.full_pod_spec = api._ApiClient__deserialize(
            {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"], "spec": template["spec"]}, "V1Pod")
        self.name = gang.job_name.removeprefix(JOB_NAME_PREFIX)  # the provider puts the prefix back
        self.namespace = gang.namespace
        self.parallelism = self.completions = gang.job["spec"]["parallelism"]
        self.base_container_name = CONTAINER
        self.termination_message_policy = template["spec"]["containers"][0]["terminationMessagePolicy"]
        self.kubernetes_conn_id = connection_id
        self.gang = gang

    def execute(self, context: Any) -> Any:
        self._adopt_for(context)
        self.job_request_obj = self.build_job_request_obj(context)
        return self.execute_resumable(context)

    def _adopt_for(self, context: Any) -> None:
        cfg, gang = render_for_run(self.run, context["run_id"], context["ti"].try_number)
        self.adopt(gang, cfg.compute.kubernetes.connection_id)

    # ResumableJobMixin -----------------------------------------------------------------------
    def submit_job(self, context: Any) -> dict[str, str]:
        cfg = self._config()
        removed = remove_jobs(self.hook, self.gang.namespace, self.gang.service_name,
                              wait_s=cfg.compute.kubernetes.termination_grace_s + 60)
        if removed:
            log.info("stopped %d Job(s) of earlier tries before starting try %d", removed,
                     context["ti"].try_number)
        self.job = self.create_job(self.job_request_obj)
        context["ti"].xcom_push(key="job_name", value=self.job.metadata.name)
        context["ti"].xcom_push(key="job_namespace", value=self.job.metadata.namespace)
        log.info("created Indexed Job %s/%s: %d node pod(s)", self.job.metadata.namespace,
                 self.job.metadata.name, self.parallelism)
        return {"name": self.job.metadata.name, "namespace": self.job.metadata.namespace}

    def get_job_status(self, external_id: Any, context: Any) -> str:
        job = _ignore_missing(self.hook.get_job_status, external_id["name"], external_id["namespace"])
        if job is None:
            return "missing"
        if self.hook.is_job_successful(job):
            return "succeeded"
        return "failed" if self.hook.is_job_failed(job) else "active"

    def is_job_active(self, status: str) -> bool:
        return status == "active"

    def is_job_succeeded(self, status: str) -> bool:
        return status == "succeeded"

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        from kubernetes.client import models as k8s

        self.job = k8s.V1Job(metadata=k8s.V1ObjectMeta(name=external_id["name"], namespace=external_id["namespace"]))
        self.pods = self.get_pods(pod_request_obj=self.pod_request_obj, context=context)
        if self.deferrable:
            self.execute_deferrable()  # raises TaskDeferred; execute_complete resumes
        job = self.hook.wait_until_job_complete(job_name=self.job.metadata.name, namespace=self.job.metadata.namespace,
                                                job_poll_interval=self.job_poll_interval)
        if error := self.hook.is_job_failed(job=job):
            raise AirflowException(f"Kubernetes Job {job.metadata.name} failed: {error}")

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, str]:
        from pipelines import stages

        model_dir = stages.finish_train(Path(self.run["run_dir"]))
        log.info("training finished: %s", model_dir)
        return {"model_dir": str(model_dir)}

    # provider hooks ----------------------------------------------------------------------------
    def execute_deferrable(self) -> None:
        trigger = GangJobTrigger(
            job_name=self.job.metadata.name, job_namespace=self.job.metadata.namespace,
            pod_names=[pod.metadata.name for pod in self.pods], pod_namespace=self.pods[0].metadata.namespace,
            base_container_name=self.base_container_name, kubernetes_conn_id=self.kubernetes_conn_id,
            cluster_context=self.cluster_context, config_file=self.config_file, in_cluster=self.in_cluster,
            poll_interval=self.job_poll_interval, get_logs=self.get_logs, do_xcom_push=False)
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any], **kwargs: Any) -> Any:
        self._adopt_for(context)  # a resumed task is a fresh operator: connection, container name
        super().execute_complete(context, event, **kwargs)  # raises when the Job failed
        return self.get_job_result(None, context)

    def get_pods(self, pod_request_obj: Any, context: Any, *, exclude_checked: bool = True) -> list[Any]:
        """The provider lists pods a few times back to back; the Job controller may not have made all yet."""
        deadline = time.monotonic() + self.pods_timeout_s
        while True:
            try:
                pods = list(super().get_pods(pod_request_obj, context, exclude_checked=exclude_checked))
            except AirflowException:  # none yet
                pods = []
            if len(pods) >= self.parallelism or time.monotonic() > deadline:
                break
            time.sleep(2)
        if not pods:
            raise AirflowException(f"no pod of Job {self.job.metadata.name} appeared in {self.pods_timeout_s:.0f}s")
        return pods

    def _config(self):
        from pipelines import stages

        return stages.load_run_config(Path(self.run["run_dir"]))
