"""A training gang's objects in the cluster, through the provider's ``KubernetesHook``: deleting
every Job of a run with foreground propagation and waiting until its pods are gone (the provider
deletes one Job and does not wait for pods)."""

from __future__ import annotations

import logging
import time
from typing import Any

from pipelines.errors import Transient

log = logging.getLogger("taxiway")


def connect(conn_id: str) -> Any:
    """The provider's hook for ``conn_id`` (an Airflow connection: no credentials in configs)."""
    from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook

    return KubernetesHook(conn_id=conn_id)


def ignore_missing(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call``, with a 404 (already gone) answered by None."""
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
    from pipelines.training import GANG_LABEL

    selector = f"{GANG_LABEL}={gang_label}"
    jobs = hook.batch_v1_client.list_namespaced_job(namespace, label_selector=selector).items
    for job in jobs:
        log.info("deleting Job %s/%s", namespace, job.metadata.name)
        ignore_missing(hook.batch_v1_client.delete_namespaced_job, job.metadata.name, namespace,
                       propagation_policy="Foreground")
    deadline = time.monotonic() + wait_s
    while pods := hook.core_v1_client.list_namespaced_pod(namespace, label_selector=selector).items:
        if time.monotonic() > deadline:
            raise Transient(f"{len(pods)} pod(s) of {selector} still present after {wait_s:.0f}s: "
                                   + ", ".join(p.metadata.name for p in pods))
        time.sleep(2)
    return len(jobs)
