"""The training gang on Kubernetes: headless Service (setup) → Indexed Job → delete both (teardown).

Built on the cncf-kubernetes provider's pod-operator family: ``GangJob`` is its
``KubernetesJobOperator`` holding a ``KubernetesLauncher`` (``pipelines.launch``), which renders the gang
from the try's ``LaunchSpec``, submits it and judges its state; the provider builds the Job it creates
from that rendering, finds its pods, streams their logs and waits. On top of the provider:

- **durable**: the Job's name is kept in Airflow 3.3's ``task_state_store`` (``ResumableJobMixin``),
  so a retry after a worker crash re-attaches to the running Job instead of starting a second gang;
- **one gang at a time**: before a new try creates its Job, the Jobs of earlier tries are deleted
  and their pods waited for (SIGTERM → checkpoint), so two gangs never write one run folder;
- **deferrable**: waiting happens in the triggerer, which also judges stalls on the run's
  ``status.json`` (a Job whose pods hang never fails by itself) and reports progress; failing or
  clearing the deferred task deletes the Job (``GangJobTrigger.on_kill``), a killed worker does the
  same (``GangJob.on_kill``); both cancel through the launcher.

The deployment picks the launcher when the DAG is parsed (``TAXIWAY_LAUNCHER=kubernetes``; a DAG's
structure cannot depend on a run's conf), and only then does the DAG import this module (the
provider costs about a second of parse time).
"""

from __future__ import annotations

import json
import logging
import time
from types import SimpleNamespace
from typing import Any

from airflow.providers.cncf.kubernetes.operators.job import JOB_NAME_PREFIX, KubernetesJobOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException
from kubernetes.client import ApiClient

from pipelines.config import RunConfig
from pipelines.errors import Transient
from pipelines.launch import k8s
from pipelines.launch.k8s import CONTAINER, TRY_LABEL, Gang
from pipelines.launch.launchers import KubernetesLauncher
from pipelines.launch.local import GangFailed
from pipelines.launch.spec import LaunchSpec
from pipelines.run_folder import State
from pipelines.stages import train as train_stage
from taxiway_airflow.failures import failure_kinds
from taxiway_airflow.hooks import kubernetes as cluster
from taxiway_airflow.links import TRAIN_LINKS
from taxiway_airflow.tasks.common import run_dir_of, run_key_of
from taxiway_airflow.tasks.kubernetes import delete_gang, gang_service, launch_for_run, launcher
from taxiway_airflow.triggers.kubernetes import GangJobTrigger

log = logging.getLogger("taxiway")

def training_gang(run: Any, **job_kwargs: Any) -> tuple[Any, Any]:
    """Service (setup) → ``GangJob`` → delete Job and Service (teardown), in the caller's task group.

    Returns (first, gang) so the caller chains ``upstream >> first`` and ``gang >> downstream``.
    """
    service = gang_service.override(task_id="service")(run)
    gang = GangJob(task_id="gang", run=run, **job_kwargs)
    teardown = delete_gang.override(task_id="teardown")(run)
    service >> gang >> teardown.as_teardown(setups=service)
    return service, gang


# --- the Job ---------------------------------------------------------------------------------

class GangJob(ResumableJobMixin, KubernetesJobOperator):
    """``KubernetesJobOperator`` running the training gang as an Indexed Job rendered from the run's config."""

    template_fields = (*KubernetesJobOperator.template_fields, "run")
    external_id_key = "taxiway_k8s_job"
    ui_color = "#e4f0ff"
    operator_extra_links = TRAIN_LINKS  # the MLflow run the trigger ships metrics into

    def __init__(self, *, run: Any, pods_timeout_s: float = 120.0, **kwargs: Any) -> None:
        kwargs = {"deferrable": True, "job_poll_interval": 5, "get_logs": True, **kwargs}
        super().__init__(completion_mode="Indexed", backoff_limit=0, wait_until_job_complete=True,
                         random_name_suffix=False, do_xcom_push=False, **kwargs)
        self.run = run
        self.pods_timeout_s = pods_timeout_s
        self.gang: Gang | None = None
        self.spec: LaunchSpec | None = None
        self.launcher: KubernetesLauncher | None = None
        self._handle: dict[str, str] | None = None  # the Job this try launched or re-attached to
        self._cfg: RunConfig | None = None
        self._watch: dict[str, Any] = {}  # what the trigger needs beyond the provider's: set before deferring

    def adopt(self, gang: Gang, spec: LaunchSpec, connection_id: str) -> None:
        """Take the rendered gang as this operator's Job and pod (what ``build_job_request_obj`` reads),
        both as ``launch/k8s.py`` rendered them (``Gang.job_shell``, ``Gang.pod``); nodes from the spec."""
        self.full_job_spec = _model(gang.job_shell, "V1Job")
        self.full_pod_spec = _model(gang.pod, "V1Pod")
        self.name = gang.job_name.removeprefix(JOB_NAME_PREFIX)  # the provider puts the prefix back
        self.namespace = gang.namespace
        self.parallelism = self.completions = spec.nodes
        self.base_container_name = CONTAINER
        self.termination_message_policy = gang.pod_spec["containers"][0]["terminationMessagePolicy"]
        self.kubernetes_conn_id = connection_id
        self.gang, self.spec = gang, spec

    def execute(self, context: Any) -> Any:
        with failure_kinds():
            self._adopt_for(context)
            self.job_request_obj = self.build_job_request_obj(context)
            return self.execute_resumable(context)

    def _adopt_for(self, context: Any) -> None:
        cfg, spec = launch_for_run(self.run, context["run_id"], context["ti"].try_number)
        self.adopt(k8s.render(spec, cfg.compute.kubernetes), spec, cfg.compute.kubernetes.connection_id)
        # the launcher's cluster calls go through this operator's hook; the Job it creates is the provider's
        # request built from the adopted rendering (with the labels the provider finds its pods by)
        self.launcher = launcher(cfg, self.hook, make_job=lambda gang: self.job_request_obj)
        self._cfg = cfg

    # ResumableJobMixin -----------------------------------------------------------------------
    def submit_job(self, context: Any) -> dict[str, str]:
        handle = self._handle = self.launcher.submit(self.spec)
        self.job = self.job_request_obj
        context["ti"].xcom_push(key="job_name", value=handle["name"])
        context["ti"].xcom_push(key="job_namespace", value=handle["namespace"])
        return handle

    def get_job_status(self, external_id: Any, context: Any) -> str:
        return self.launcher.state(external_id)

    def is_job_active(self, status: str) -> bool:
        return status == State.RUNNING

    def is_job_succeeded(self, status: str) -> bool:
        return status == State.SUCCEEDED

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        self._handle = external_id
        self.job = cluster.job_status(self.hook, external_id["namespace"], external_id["name"])
        if self.job is None:
            raise Transient(f"Kubernetes Job {external_id['namespace']}/{external_id['name']} is gone")
        self.pods = self.get_pods(pod_request_obj=self.pod_request_obj, context=context)
        c = self._cfg.compute
        self._watch = {"watch": self.launcher.watch(external_id, self.spec).as_dict(),
                       "run_key": run_key_of(self.run, self.dag_id, context["run_id"]),
                       "attempt": int(self.job.metadata.labels.get(TRY_LABEL, "1")),
                       "report_every_s": c.report_every_s,
                       "pods": c.kubernetes.model_dump(mode="json"),  # the trigger's launcher: it cancels
                       # four looks per stall window, but never more than one API read a second
                       "poll_interval": max(1.0, min(self.job_poll_interval, c.stall_timeout_s / 4))}
        if self.deferrable:
            self.execute_deferrable()  # raises TaskDeferred; execute_complete resumes
        job = self.hook.wait_until_job_complete(job_name=self.job.metadata.name, namespace=self.job.metadata.namespace,
                                                job_poll_interval=self.job_poll_interval)
        if error := self.hook.is_job_failed(job=job):
            raise GangFailed(f"Kubernetes Job {job.metadata.name} failed: {error}")

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, str]:
        model_dir = train_stage.finish(run_dir_of(self.run))
        log.info("training finished: %s", model_dir)
        return {"model_dir": str(model_dir)}

    # provider hooks ----------------------------------------------------------------------------
    def execute_deferrable(self) -> None:
        trigger = GangJobTrigger(
            job_name=self.job.metadata.name, job_namespace=self.job.metadata.namespace,
            pod_names=[pod.metadata.name for pod in self.pods], pod_namespace=self.pods[0].metadata.namespace,
            base_container_name=self.base_container_name, kubernetes_conn_id=self.kubernetes_conn_id,
            cluster_context=self.cluster_context, config_file=self.config_file, in_cluster=self.in_cluster,
            get_logs=self.get_logs, do_xcom_push=False, **self._watch)
        self.defer(trigger=trigger, method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any], **kwargs: Any) -> Any:
        with failure_kinds():
            self._adopt_for(context)  # a resumed task is a fresh operator: connection, container name
            super().execute_complete(context, event, **kwargs)  # raises when the Job failed
            return self.get_job_result(None, context)

    def on_kill(self) -> None:
        """A worker killed while it held the task: cancel the Job this try launched or re-attached to
        (foreground: its pods get SIGTERM and their grace, so the newest checkpoint is saved). ``_killed``
        as the provider's own ``on_kill`` sets it: its pod cleanup then leaves the pods to that deletion."""
        self._killed = True
        if self.launcher is not None and self._handle is not None:
            self.launcher.cancel(self._handle)
            log.info("canceled Job %s/%s", self._handle["namespace"], self._handle["name"])

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
            raise Transient(f"no pod of Job {self.job.metadata.name} appeared in {self.pods_timeout_s:.0f}s")
        return pods


def _model(obj: dict[str, Any], kind: str) -> Any:
    """A plain manifest as the client's model object (``V1Job``, ``V1Pod``), through the client's
    public ``deserialize``, which reads a response's JSON ``data``."""
    return ApiClient().deserialize(SimpleNamespace(data=json.dumps(obj)), kind)
