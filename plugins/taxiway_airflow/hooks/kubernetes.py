"""Every cluster call Taxiway makes, through the provider's ``KubernetesHook`` and with the provider's
retry wrapper (``generic_api_retry``: transient API statuses and connection errors, honouring
``Retry-After``); ``HookCluster`` answers a ``KubernetesLauncher``'s calls (``pipelines.launch.cluster``)
with them. Beyond the provider: deleting every Job of a run with foreground propagation and waiting
until its pods are gone (the provider deletes one Job and does not wait for pods)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.kubernetes_helper_functions import generic_api_retry
from kubernetes.client.exceptions import ApiException

from pipelines.errors import Transient
from pipelines.launch.k8s import GANG_LABEL, Gang

log = logging.getLogger("taxiway")


def connect(conn_id: str) -> KubernetesHook:
    """The provider's hook for ``conn_id`` (an Airflow connection: no credentials in configs)."""
    return KubernetesHook(conn_id=conn_id)


def _missing_is_none(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call``, with a 404 (already gone) answered by None."""
    try:
        return call(*args, **kwargs)
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None


@generic_api_retry
def create_service(hook: KubernetesHook, namespace: str, service: dict[str, Any]) -> bool:
    """Create the gang's headless Service; False when it exists already (a retried setup)."""
    try:
        hook.core_v1_client.create_namespaced_service(namespace, service)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


@generic_api_retry
def delete_service(hook: KubernetesHook, namespace: str, name: str) -> None:
    _missing_is_none(hook.core_v1_client.delete_namespaced_service, name, namespace)


@generic_api_retry
def delete_job(hook: KubernetesHook, namespace: str, name: str) -> None:
    """Foreground: the Job is gone once its pods are (each given its termination grace period)."""
    _missing_is_none(hook.batch_v1_client.delete_namespaced_job, name, namespace, propagation_policy="Foreground")


def job_status(hook: KubernetesHook, namespace: str, name: str) -> Any:
    """The Job (``V1Job``), or None when it is gone (the provider's ``get_job_status`` carries the retry wrapper
    itself: wrapping it again would multiply the attempts)."""
    return _missing_is_none(hook.get_job_status, name, namespace)


@generic_api_retry
def _jobs(hook: KubernetesHook, namespace: str, selector: str) -> list[Any]:
    return hook.batch_v1_client.list_namespaced_job(namespace, label_selector=selector).items


@generic_api_retry
def _pods(hook: KubernetesHook, namespace: str, selector: str) -> list[Any]:
    return hook.core_v1_client.list_namespaced_pod(namespace, label_selector=selector).items


def remove_jobs(hook: KubernetesHook, namespace: str, gang_label: str, wait_s: float) -> int:
    """Delete every Job of this gang (all tries) and wait until their pods are gone; returns Jobs deleted.

    Foreground propagation: pods get SIGTERM and their termination grace period, in which the
    trainer saves a checkpoint.
    """
    selector = f"{GANG_LABEL}={gang_label}"
    jobs = _jobs(hook, namespace, selector)
    for job in jobs:
        log.info("deleting Job %s/%s", namespace, job.metadata.name)
        delete_job(hook, namespace, job.metadata.name)
    deadline = time.monotonic() + wait_s
    while pods := _pods(hook, namespace, selector):
        if time.monotonic() > deadline:
            raise Transient(f"{len(pods)} pod(s) of {selector} still present after {wait_s:.0f}s: "
                            + ", ".join(p.metadata.name for p in pods))
        time.sleep(2)
    return len(jobs)


@generic_api_retry
def create_job(hook: KubernetesHook, namespace: str, job: Any) -> None:
    hook.batch_v1_client.create_namespaced_job(namespace, job)


def job_state(hook: KubernetesHook, namespace: str, name: str) -> str:
    """``active``, ``succeeded``, ``failed``, ``deleting`` (a stalled or canceled gang on its way out: never
    re-attached to) or ``missing``, as the provider judges a Job."""
    job = job_status(hook, namespace, name)
    if job is None:
        return "missing"
    if job.metadata.deletion_timestamp:
        return "deleting"
    if hook.is_job_successful(job):
        return "succeeded"
    return "failed" if hook.is_job_failed(job) else "active"


class HookCluster:
    """A ``KubernetesLauncher``'s cluster (``pipelines.launch.cluster.Cluster``) through ``hook``.
    ``make_job``: the object created for a gang's Job, the rendered manifest by default (the Job
    operator gives its own request, which carries the labels the provider finds its pods by)."""

    def __init__(self, hook: KubernetesHook, make_job: Callable[[Gang], Any] | None = None) -> None:
        self.hook, self.make_job = hook, make_job

    def create_service(self, namespace: str, service: dict[str, Any]) -> bool:
        return create_service(self.hook, namespace, service)

    def create_job(self, gang: Gang) -> None:
        create_job(self.hook, gang.namespace, self.make_job(gang) if self.make_job else gang.job)

    def job_state(self, namespace: str, name: str) -> str:
        return job_state(self.hook, namespace, name)

    def job_created(self, namespace: str, name: str) -> float | None:
        job = job_status(self.hook, namespace, name)
        return job.metadata.creation_timestamp.timestamp() if job is not None else None

    def delete_job(self, namespace: str, name: str) -> None:
        delete_job(self.hook, namespace, name)

    def remove_jobs(self, namespace: str, gang_label: str, wait_s: float) -> int:
        return remove_jobs(self.hook, namespace, gang_label, wait_s)

    def delete_service(self, namespace: str, name: str) -> None:
        delete_service(self.hook, namespace, name)
