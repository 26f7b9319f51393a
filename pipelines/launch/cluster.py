"""The cluster calls a ``KubernetesLauncher`` makes, as a protocol: the Airflow side answers them
through the provider's ``KubernetesHook`` and its retry wrapper (``taxiway_airflow/hooks/kubernetes.py``),
so this layer never imports Airflow."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Cluster(Protocol):
    def create_service(self, namespace: str, service: dict[str, Any]) -> bool:
        """Create it; False when it exists already."""

    def create_job(self, gang: Any) -> None:
        """Create the Job of ``gang`` (a ``k8s.Gang``)."""

    def job_state(self, namespace: str, name: str) -> str:
        """``active``, ``succeeded``, ``failed``, ``deleting`` (on its way out), or ``missing``."""

    def job_created(self, namespace: str, name: str) -> float | None:
        """When the Job was created (epoch seconds); None when it is gone."""

    def delete_job(self, namespace: str, name: str) -> None:
        """Foreground: its pods get SIGTERM and their grace; gone already is fine."""

    def remove_jobs(self, namespace: str, gang_label: str, wait_s: float) -> int:
        """Delete every Job of a gang (all tries), wait until their pods are gone; returns Jobs deleted."""

    def delete_service(self, namespace: str, name: str) -> None:
        """Gone already is fine."""
