"""The training gang as one Airflow task: launch (or re-attach), watch from the triggerer, finish.

- Launch identity lives in Airflow 3.3's ``task_state_store`` (``ResumableJobMixin``): a worker
  that dies while the gang runs comes back as a retry that re-attaches to the same gang instead
  of starting a second one.
- Waiting is deferred to ``GangTrigger``; it wakes the task every ``report_every_s`` to log
  progress and ship new ``metrics.jsonl`` lines to MLflow, then defers again.
- A failed node or a stall fails the attempt after the whole gang is cleaned up; the task's
  retries relaunch it and the trainer resumes from its newest valid checkpoint.
- Failing or clearing the task cancels the gang (SIGTERM → checkpoint → ``canceled``).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator, BaseSensorOperator
from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from taxiway_airflow.triggers import GangTrigger

log = logging.getLogger("taxiway")


def _run_dir(run: dict[str, Any]) -> Path:
    return Path(run["run_dir"])


class TrainGang(ResumableJobMixin, BaseOperator):
    """Run the trainer as a gang of ``compute.nodes`` nodes and wait for it without a worker slot."""

    template_fields = ("run",)
    external_id_key = "taxiway_gang"
    ui_color = "#f0e4ff"

    def __init__(self, *, run: Any, poll_s: float = 2.0, report_every_s: float = 30.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run = run
        self.poll_s = poll_s
        self.report_every_s = report_every_s

    # ResumableJobMixin: submit / status / reconnect -------------------------------------------
    def execute(self, context: Any) -> Any:
        return self.execute_resumable(context)

    def submit_job(self, context: Any) -> str:
        from pipelines import stages

        run_dir = _run_dir(self.run)
        cfg = stages.load_run_config(run_dir)
        if cfg.compute.launcher != "local":
            raise AirflowFailException(f"compute.launcher is {cfg.compute.launcher!r} but this deployment's DAG "
                                       "launches local gangs (set TAXIWAY_LAUNCHER where the DAG is parsed)")
        handle = stages.launch_gang(cfg, run_dir)
        log.info("launched gang %s: %d node(s), attempt %d (restarts so far: %d), logs under %s",
                 handle.gang_id, len(handle.nodes), handle.attempt, handle.attempt - 1,
                 Path(handle.nodes[0].log).parent)
        return str(handle.path)

    def get_job_status(self, external_id: Any, context: Any) -> str:
        from pipelines.launch import local

        path = Path(external_id)
        return local.poll(local.Handle.load(path)).state if path.exists() else local.FAILED

    def is_job_active(self, status: str) -> bool:
        return status == "running"

    def is_job_succeeded(self, status: str) -> bool:
        return status == "succeeded"

    def poll_until_complete(self, external_id: Any, context: Any) -> None:
        from pipelines.launch import local
        from pipelines.launch.watch import Watch

        handle = local.Handle.load(Path(external_id))
        cfg = self._config()
        started = datetime.fromisoformat(handle.started_at).timestamp()
        self._defer(Watch(str(handle.path), cfg.compute.stall_timeout_s, cfg.compute.startup_timeout_s,
                          started + cfg.compute.timeout_s).as_dict())

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        from pipelines import stages

        run_dir = _run_dir(self.run)
        self._ship_metrics(context, external_id)
        model_dir = stages.finish_train(run_dir)
        log.info("training finished: %s", model_dir)
        return {"model_dir": str(model_dir)}

    # Deferral loop -----------------------------------------------------------------------------
    def _config(self):
        from pipelines import stages

        return stages.load_run_config(_run_dir(self.run))

    def _defer(self, watch: dict[str, Any]) -> None:
        cfg = self._config()
        self.defer(trigger=GangTrigger(watch, self.poll_s, self.report_every_s, cfg.compute.cancel_grace_s),
                   method_name="execute_complete")

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        from pipelines import stages
        from pipelines.launch import local

        run_dir = _run_dir(self.run)
        watch = event["watch"]
        handle = local.Handle.load(Path(watch["gang_json"]))
        elapsed = time.time() - datetime.fromisoformat(handle.started_at).timestamp()
        if line := stages.progress_line(run_dir, elapsed):
            log.info("attempt %d: %s", handle.attempt, line)
        self._ship_metrics(context, watch["gang_json"])
        state = event["state"]
        if state == local.RUNNING:
            return self._defer(watch)
        if state == local.SUCCEEDED:
            return self.get_job_result(watch["gang_json"], context)
        killed = local.cleanup(handle, self._config().compute.cancel_grace_s)
        log.error("gang attempt %d %s: %s (processes killed at cleanup: %d); a retry resumes from the newest "
                  "valid checkpoint", handle.attempt, state, event["detail"], killed)
        if state == "timed_out":
            raise AirflowFailException(event["detail"])
        raise AirflowException(f"training gang {state}: {event['detail']}")

    def _ship_metrics(self, context: Any, gang_json: str) -> None:
        """New metrics lines and the restart count to the MLflow run; never fails the task over it."""
        from pipelines import live_metrics
        from pipelines.launch import local

        run_dir = _run_dir(self.run)
        try:
            restarts = local.Handle.load(Path(gang_json)).attempt - 1
            live_metrics.ship(self._config(), run_dir, context["run_id"], restarts=restarts)
        except Exception as exc:  # tracking server down: the lines stay unshipped and go next time
            log.warning("could not ship metrics to MLflow yet: %s", exc)

    def on_kill(self) -> None:
        """Killed while the worker held it (not deferred): stop the gang the same way the trigger does."""
        from pipelines.launch import local

        path = local.handle_path(_run_dir(self.run))
        if path.exists():
            local.cleanup(local.Handle.load(path), self._config().compute.cancel_grace_s)


class CheckpointSensor(BaseSensorOperator):
    """Evaluation starts only once the final checkpoint is complete, valid and exported."""

    template_fields = ("run",)

    def __init__(self, *, run: Any, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 5)
        kwargs.setdefault("timeout", 600)
        kwargs.setdefault("mode", "reschedule")
        super().__init__(**kwargs)
        self.run = run

    def poke(self, context: Any) -> bool:
        from pipelines import stages

        run_dir = _run_dir(self.run)
        ready, reason = stages.final_checkpoint_ready(run_dir)
        log.info("%s", reason)
        return ready
