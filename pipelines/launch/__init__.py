"""Launching the trainer's gang: one protocol, two launchers (docs/architecture.md, Launchers).

Rooms:

- ``spec.py``: ``LaunchSpec``, the one carrier of nodes and processes, and the trainer's own spec;
- ``launchers.py``: ``LocalLauncher`` and ``KubernetesLauncher``, the two implementations of ``Launcher``;
- ``local.py``: a local gang's processes: start, poll, cancel, clean up, the watch lease;
- ``node.py``: the wrapper each local node runs in (its exit code, the grace, the lease);
- ``k8s.py``: a gang's Kubernetes objects (headless Service, Indexed Job), rendered from a ``LaunchSpec``;
- ``cluster.py``: the cluster calls a ``KubernetesLauncher`` makes (the Airflow hook answers them);
- ``watch.py``: the clocks a watcher keeps: running, done, failed, stalled.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

from pipelines.launch.spec import LaunchSpec

H = TypeVar("H")


@runtime_checkable
class Launcher(Protocol[H]):
    """Where a gang runs. ``H`` is the launcher's handle: plain data a later process (a retried task, a
    trigger in another process) loads again, so nobody has to be the gang's parent."""

    def submit(self, spec: LaunchSpec) -> H:
        """Start the gang of ``spec``; whatever is left of an earlier launch of the run is stopped first,
        so two gangs never write one run folder."""

    def state(self, handle: H) -> str:
        """``running``, ``succeeded``, ``failed``, or ``canceled`` (a user's cancel, or on its way out):
        what is not running is never re-attached to."""

    def watch(self, handle: H, spec: LaunchSpec) -> Any:
        """The progress clock a waiting watcher keeps on it (``watch.Watch`` or ``watch.StatusWatch``)."""

    def cancel(self, handle: H) -> None:
        """A user's cancel: SIGTERM, the trainer checkpoints and exits; returns without waiting."""

    def finish(self, handle: H) -> int:
        """Leave nothing of the launch running (what a launch always ends with); returns what it stopped."""


__all__ = ["H", "LaunchSpec", "Launcher"]
