"""The two launchers (``pipelines.launch.Launcher``): a local gang of torchrun "nodes" on this host, and an
Indexed Job on Kubernetes. Each takes a ``LaunchSpec`` and answers the same five calls: ``TrainGang`` and
its trigger hold a ``LocalLauncher``, ``GangJob`` and the Kubernetes setup and teardown tasks a
``KubernetesLauncher``. What only one of them has (a local gang's watch lease and hand-over, a Kubernetes
gang's headless Service) stays that one's own."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from pipelines.config.kubernetes import KubernetesConfig
from pipelines.launch import k8s, local
from pipelines.launch.cluster import Cluster
from pipelines.launch.spec import LaunchSpec
from pipelines.launch.watch import StatusWatch, Watch
from pipelines.run_folder import RunFolder, State

log = logging.getLogger("taxiway")


@dataclass(frozen=True)
class LocalLauncher:
    """Processes on this host (``local.py``); the handle is the run's ``train/gang.json``. ``grace_s``:
    how long ``finish`` lets a canceled gang save its checkpoint before SIGKILL."""

    grace_s: float = 30.0

    def submit(self, spec: LaunchSpec) -> local.Handle:
        return local.submit(spec)

    def state(self, handle: local.Handle) -> str:
        """A gang a user canceled reads ``canceled`` while it still saves its checkpoint."""
        if local.cancel_reason(handle) == local.USER:
            return State.CANCELED
        return local.poll(handle).state

    def watch(self, handle: local.Handle, spec: LaunchSpec) -> Watch:
        return Watch(str(handle.path), handle.gang_id, spec.stall_timeout_s, spec.startup_timeout_s,
                     handle.started + spec.timeout_s)

    def cancel(self, handle: local.Handle) -> None:
        local.cancel(handle, local.USER)

    def finish(self, handle: local.Handle) -> int:
        return local.cleanup(handle, self.grace_s)

    @staticmethod
    def started_up(handle: local.Handle) -> bool:
        """The trainer of this launch wrote its first heartbeat."""
        heartbeat = RunFolder.of_gang(handle.path).read_status().get("heartbeat_at")
        return bool(heartbeat) and datetime.fromisoformat(heartbeat).timestamp() >= handle.started


_JOB_STATES = {"active": State.RUNNING, "succeeded": State.SUCCEEDED, "failed": State.FAILED,
               "missing": State.FAILED, "deleting": State.CANCELED}


@dataclass(frozen=True)
class KubernetesLauncher:
    """An Indexed Job (one pod per node) behind the run's headless Service (``k8s.py``), through ``cluster``;
    the handle is the Job's name and namespace and the gang's Service. ``pods``: the config's
    ``compute.kubernetes`` (image, volume, resources)."""

    cluster: Cluster
    pods: KubernetesConfig

    def render(self, spec: LaunchSpec) -> k8s.Gang:
        return k8s.render(spec, self.pods)

    def handle(self, spec: LaunchSpec) -> dict[str, str]:
        """The handle of ``spec``'s gang (its names), without launching it: what a teardown finishes."""
        return _handle(self.render(spec))

    def open(self, spec: LaunchSpec) -> bool:
        """The headless Service that makes rank 0 resolvable, made once per run before its first Job (a
        setup task); False when it exists already."""
        gang = self.render(spec)
        return self.cluster.create_service(gang.namespace, gang.service)

    def submit(self, spec: LaunchSpec) -> dict[str, str]:
        """The earlier tries' Jobs are deleted and their pods waited for (SIGTERM → checkpoint) first."""
        gang = self.render(spec)
        removed = self.cluster.remove_jobs(gang.namespace, gang.service_name, self._wait_s)
        if removed:
            log.info("stopped %d Job(s) of earlier tries before starting try %d", removed, spec.try_number)
        self.cluster.create_service(gang.namespace, gang.service)  # made by the setup; here for a lone launch
        self.cluster.create_job(gang)
        log.info("created Indexed Job %s/%s: %d node pod(s)", gang.namespace, gang.job_name, spec.nodes)
        return _handle(gang)

    def state(self, handle: dict[str, str]) -> str:
        """A Job on its way out (deleted for a stall or a cancel) reads ``canceled``, a gone one ``failed``."""
        return _JOB_STATES[self.cluster.job_state(handle["namespace"], handle["name"])]

    def watch(self, handle: dict[str, str], spec: LaunchSpec) -> StatusWatch:
        """The stall clock on ``status.json`` (the Job itself enforces ``timeout_s``), from the Job's creation."""
        started = self.cluster.job_created(handle["namespace"], handle["name"]) or time.time()
        return StatusWatch(str(spec.run_dir), started, spec.stall_timeout_s, spec.startup_timeout_s)

    def cancel(self, handle: dict[str, str]) -> None:
        self.cluster.delete_job(handle["namespace"], handle["name"])

    def finish(self, handle: dict[str, str]) -> int:
        """Every Job of the run (their pods waited for) and its Service; returns the Jobs deleted."""
        jobs = self.cluster.remove_jobs(handle["namespace"], handle["service"], self._wait_s)
        self.cluster.delete_service(handle["namespace"], handle["service"])
        log.info("deleted %d Job(s) and Service %s/%s; no pod of the gang is left", jobs, handle["namespace"],
                 handle["service"])
        return jobs

    @property
    def _wait_s(self) -> float:
        return self.pods.termination_grace_s + 60


def _handle(gang: k8s.Gang) -> dict[str, str]:
    return {"name": gang.job_name, "namespace": gang.namespace, "service": gang.service_name}
