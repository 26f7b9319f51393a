"""The provider's Job trigger, plus: a user failing or clearing the deferred task deletes the Job."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger

from taxiway_airflow.hooks import kubernetes as cluster


class GangJobTrigger(KubernetesJobTrigger):
    """The provider's Job trigger, plus: a user failing or clearing the deferred task deletes the Job."""

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    async def on_kill(self) -> None:
        hook = cluster.connect(self.kubernetes_conn_id)
        await asyncio.to_thread(cluster.delete_job, hook, self.job_namespace, self.job_name)
