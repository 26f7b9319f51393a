"""The provider's Job trigger, plus: a user failing or clearing the deferred task deletes the Job."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

from taxiway_airflow.hooks.kubernetes import connect, ignore_missing


class GangJobTrigger(KubernetesJobTrigger):
    """The provider's Job trigger, plus: a user failing or clearing the deferred task deletes the Job."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def on_kill(self) -> None:
        hook = connect(self.kubernetes_conn_id)
        await asyncio.to_thread(ignore_missing, hook.batch_v1_client.delete_namespaced_job, self.job_name,
                                self.job_namespace, propagation_policy="Foreground")
