"""The training gang as one Airflow task: launch (or re-attach), watch from the triggerer, finish; the
task holds a ``LocalLauncher`` (``pipelines.launch``).

- Launch identity lives in Airflow 3.3's ``task_state_store`` (``ResumableJobMixin``): a worker
  that dies while the gang runs comes back as a retry that re-attaches to the same gang instead
  of starting a second one.
- The task confirms the launch (first heartbeat), then defers to ``GangTrigger`` until the gang
  ends; the trigger logs progress and ships new ``metrics.jsonl`` lines to MLflow meanwhile.
- A failed node or a stall fails the attempt after the whole gang is cleaned up; the task's
  retries relaunch it and the trainer resumes from its newest valid checkpoint.
- Any user action on the task or run (mark failed/success, clear, delete) cancels the gang
  (SIGTERM → checkpoint → ``canceled``): ``GangTrigger.on_kill`` while deferred, ``on_kill`` while
  running; each node SIGKILLs its gang's leftovers after ``compute.cancel_grace_s``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowFailException

from pipelines.errors import BadInput
from pipelines.launch import local
from pipelines.launch.launchers import LocalLauncher
from pipelines.launch.local import GangFailed, GangTimedOut
from pipelines.launch.spec import launch_spec
from pipelines.launch.watch import SUPERSEDED, TIMED_OUT
from pipelines.run_folder import State
from pipelines.stages import train as train_stage
from taxiway_airflow.failures import failure_kinds
from taxiway_airflow.links import TRAIN_LINKS
from taxiway_airflow.tasks.common import run_config, run_dir_of, run_key_of
from taxiway_airflow.triggers.gang import GangTrigger

log = logging.getLogger("taxiway")


class TrainGang(ResumableJobMixin, BaseOperator):
    """Run the trainer as a gang of ``compute.nodes`` nodes and wait for it without a worker slot."""

    template_fields = ("run",)
    external_id_key = "taxiway_gang"
    ui_color = "#f0e4ff"
    operator_extra_links = TRAIN_LINKS  # the MLflow run the trigger ships metrics into
    launch_confirm_s = 60.0  # wait here for the gang's first sign of life before deferring

    def __init__(self, *, run: Any, poll_s: float = 2.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.poll_s = poll_s
        self._gang_id: str | None = None  # the gang this try holds (launched or re-attached to)
        self.launcher = LocalLauncher()

    # ResumableJobMixin: submit / status / reconnect -------------------------------------------
    def execute(self, context: Any) -> Any:
        with failure_kinds():
            return self.execute_resumable(context)

    def submit_job(self, context: Any) -> str:
        cfg = self._config()
        if cfg.compute.launcher != "local":
            raise BadInput(f"compute.launcher is {cfg.compute.launcher!r} but this deployment's DAG "
                           "launches local gangs (set TAXIWAY_LAUNCHER where the DAG is parsed)")
        handle = self.launcher.submit(train_stage.spec(cfg, run_dir_of(self.run)))
        self._gang_id = handle.gang_id
        log.info("launched gang %s: %d node(s), attempt %d (restarts so far: %d), logs under %s",
                 handle.gang_id, len(handle.nodes), handle.attempt, handle.attempt - 1,
                 Path(handle.nodes[0].log).parent)
        return str(handle.path)

    def get_job_status(self, external_id: Any, context: Any) -> str:
        """A gang a user canceled reads ``canceled``: a clear's new try launches afresh (submit waits)."""
        if not Path(external_id).exists():
            return State.FAILED
        return self.launcher.state(local.Handle.load(Path(external_id)))

    def is_job_active(self, status: str) -> bool:
        return status == State.RUNNING

    def is_job_succeeded(self, status: str) -> bool:
        return status == State.SUCCEEDED

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        """Confirm the launch here (a gang that dies at start fails this try at once), then defer:
        the trigger watches the gang until it ends, so a cancel always finds one of the two."""
        handle = local.Handle.load(Path(external_id))
        self._gang_id = handle.gang_id
        cfg = self._config()
        deadline = time.monotonic() + self.launch_confirm_s
        while (self.launcher.state(handle) == State.RUNNING and time.monotonic() < deadline
               and not self.launcher.started_up(handle)):
            self._cancel_unless_running(context, handle)
            time.sleep(0.5)
        self._cancel_unless_running(context, handle)  # the last word before handing over to the trigger
        local.hand_over(handle)  # a cancel before the triggerer runs the trigger reaches no on_kill
        watch = self.launcher.watch(handle, launch_spec(cfg, run_dir_of(self.run)))
        self.defer(trigger=GangTrigger(watch.as_dict(), self.poll_s, cfg.compute.report_every_s, cfg.compute.cancel_grace_s,
                                       run_key_of(self.run, self.dag_id, context["run_id"])),
                   method_name="execute_complete")

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        self._report(external_id, context)
        model_dir = train_stage.finish(run_dir_of(self.run))
        log.info("training finished: %s", model_dir)
        return {"model_dir": str(model_dir)}

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        """The trigger fires once, when the gang has ended; anything but success was already stopped."""
        with failure_kinds():
            return self._complete(context, event)

    def _complete(self, context: Any, event: dict[str, Any]) -> Any:
        gang_json = event["watch"]["gang_json"]
        if event["state"] == State.SUCCEEDED:
            return self.get_job_result(gang_json, context)
        self._report(gang_json, context)
        handle = local.Handle.load(Path(gang_json))
        if self.launcher.state(handle) == State.CANCELED:
            # Canceled, yet this try is alive: an earlier try's trigger canceled it after this try had
            # re-attached (a clear lands in both at once). Carry on as the clear meant: relaunch.
            log.info("gang %s was canceled by an earlier try of this task; relaunching from its newest "
                     "checkpoint", handle.gang_id)
            external_id = self.submit_job(context)
            if store := context.get("task_state_store"):
                store.set(self.external_id_key, external_id)
            return self.poll_until_complete(external_id, context)
        if event["state"] == SUPERSEDED:  # another try launched since: a retry re-attaches to it
            raise GangFailed(f"{event['detail']}; this try no longer owns the run's training")
        attempt = handle.attempt
        log.error("gang attempt %d %s: %s; a retry resumes from the newest valid checkpoint",
                  attempt, event["state"], event["detail"])
        if event["state"] == TIMED_OUT:
            raise GangTimedOut(event["detail"])
        raise GangFailed(f"training gang {event['state']}: {event['detail']}")

    def _cancel_unless_running(self, context: Any, handle: local.Handle) -> None:
        """A user acted on this try (its state is no longer ``running``) before the supervisor's
        SIGTERM arrived: cancel the gang here, since once deferred nobody would."""
        ti = context["ti"]
        mapped = ti.map_index is not None and ti.map_index >= 0  # a sweep member: the answer keys it task_mapindex
        try:
            states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id],
                                        map_index=ti.map_index if mapped else None)
        except Exception as exc:  # no answer is no reason to cancel a gang
            log.warning("could not read this task's state: %s", exc)
            return
        state = states.get(ti.run_id, {}).get(f"{ti.task_id}_{ti.map_index}" if mapped else ti.task_id)
        if state != "running":
            self.launcher.cancel(handle)
            raise AirflowFailException(f"task is {state or 'gone'} (user action): canceled gang {handle.gang_id}")

    def _config(self):
        return run_config(run_dir_of(self.run))

    def _report(self, gang_json: str, context: Any) -> None:
        """Progress line and new metrics to MLflow; never fails the task over it."""
        try:
            handle = local.Handle.load(Path(gang_json))
            if line := train_stage.report(run_dir_of(self.run), run_key_of(self.run, self.dag_id, context["run_id"]),
                                          handle.attempt, handle.started):
                log.info("%s", line)
        except Exception as exc:  # tracking server down: the lines stay unshipped and go next time
            log.warning("could not ship metrics to MLflow yet: %s", exc)

    def on_kill(self) -> None:
        """Killed while the worker held it (not deferred): cancel the gang this try launched or
        re-attached to (or is launching: a gang id names the process that made it), never a newer one
        another try started since. The worker gets a few seconds
        before SIGKILL, so this only signals; each node enforces the grace period itself."""
        handle = local.current(run_dir_of(self.run))
        if handle and (handle.gang_id == self._gang_id or local.launched_here(handle)):
            self.launcher.cancel(handle)
            log.info("canceled gang %s: SIGTERM sent", handle.gang_id)
