"""The provider's Job trigger, plus what a training gang needs while it waits in the triggerer.

- **Stalls**: a Job whose pods all run but train no further (a node cut off from the others hangs
  every rank's collective; nothing exits, so the Job never fails) is judged on the run's
  ``status.json`` by the same clock as a local gang (``compute.stall_timeout_s``, before the first
  step ``compute.startup_timeout_s``): the trigger deletes the Job and fires an error, and the
  task's retry starts the next gang from the newest valid checkpoint.
- **Progress**: every ``compute.report_every_s`` a progress line, and new metric lines go to the
  run's MLflow run.
- **Cancel**: a user failing or clearing the deferred task deletes the Job (``on_kill``), through the
  run's ``KubernetesLauncher``, as a stall does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.triggers.base import TriggerEvent

from pipelines.config.kubernetes import KubernetesConfig
from pipelines.launch.launchers import KubernetesLauncher
from pipelines.launch.watch import StatusWatch
from pipelines.stages import train as train_stage
from taxiway_airflow.hooks import kubernetes as cluster
from taxiway_airflow.triggers.gang import log_progress, min_event_delay_s


class GangJobTrigger(KubernetesJobTrigger):
    """``pods``: the run's ``compute.kubernetes`` as a dict (the launcher that cancels the Job; None in a
    trigger serialized before it was carried, still deferred across an upgrade: a cancel calls only the
    cluster, so the defaults serve); ``watch``: a ``StatusWatch`` as a dict (no stall check without one);
    ``run_key``, ``attempt`` and ``report_every_s``: where progress goes and how often."""

    def __init__(self, *, pods: dict[str, Any] | None = None, watch: dict[str, Any] | None = None, run_key: str | None = None,
                 attempt: int = 1, report_every_s: float = 60.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pods, self.watch, self.run_key = pods, watch, run_key
        self.attempt, self.report_every_s = attempt, report_every_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        _, kwargs = super().serialize()
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {**kwargs, "pods": self.pods, "watch": self.watch, "run_key": self.run_key, "attempt": self.attempt,
                 "report_every_s": self.report_every_s})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        started = reported = time.monotonic()
        watch = StatusWatch(**self.watch) if self.watch else None
        stalled = None
        while True:
            job = await self.hook.get_job_status(name=self.job_name, namespace=self.job_namespace)
            if self.hook.is_job_complete(job=job):
                break
            if watch and (stalled := await asyncio.to_thread(watch.stalled)):
                self.log.warning("Job %s stalled: %s; deleting it", self.job_name, stalled)
                await self._delete()
                break
            if self.run_key and time.monotonic() - reported >= self.report_every_s:
                reported = time.monotonic()
                await self._report(watch)
            await asyncio.sleep(self.poll_interval)
        if self.run_key:
            await self._report(watch)
        await asyncio.sleep(max(0.0, min_event_delay_s() - (time.monotonic() - started)))
        error = f"Job stalled: {stalled}" if stalled else self.hook.is_job_failed(job=job)
        yield TriggerEvent({
            "name": job.metadata.name, "namespace": job.metadata.namespace, "pod_names": list(self.pod_names),
            "pod_namespace": self.pod_namespace, "status": "error" if error else "success",
            "message": f"Job failed with error: {error}" if error else "Job completed successfully",
            "job": job.to_dict(), "xcom_result": None})

    async def _report(self, watch: StatusWatch | None) -> None:
        if watch is not None:
            await log_progress(self.log, lambda: train_stage.report(Path(watch.run_dir), self.run_key, self.attempt,
                                                                    watch.started))

    async def _delete(self) -> None:
        launcher = KubernetesLauncher(cluster.HookCluster(cluster.connect(self.kubernetes_conn_id)),
                                      KubernetesConfig.model_validate(self.pods or {}))
        await asyncio.to_thread(launcher.cancel, {"name": self.job_name, "namespace": self.job_namespace})

    async def on_kill(self) -> None:
        await self._delete()
