"""Trigger that watches a training gang from the triggerer, so waiting holds no worker slot.

It stays deferred for the gang's whole life and fires once, when the gang has ended
(succeeded, failed, stalled, timed out). Progress lines and new metrics go out from here every
``report_every_s``. Waking the task between reports would open a window in which the task is
neither deferred nor running: a cancel landing there (mark failed, clear) reaches neither
``on_kill``, and the gang would train on unwatched. For the same reason a stalled or timed-out
gang is stopped here, before the event fires.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from airflow.configuration import conf
from airflow.sdk.exceptions import AirflowSecretsBackendAccessDenied
from airflow.triggers.base import BaseTrigger, TriggerEvent

from pipelines.launch import local
from pipelines.launch.launchers import LocalLauncher
from pipelines.launch.watch import SUPERSEDED, Watch
from pipelines.run_folder import RunFolder, State
from pipelines.stages import train as train_stage
from taxiway_airflow import mlflow_connection

# Airflow 3.3 fails a resumed task if its trigger fires before the scheduler has drained the
# executor's "success" for the try that deferred (apache/airflow#72716, #71580; fixes not yet
# released): seen live when a cleared try re-attached to a gang that the previous try's trigger
# was canceling, so the event came 3 s after deferral while the deferring process took 5 s to
# exit. An event is therefore never sent sooner than this after the trigger started; a gang
# that ends that early is rare (its start-up alone takes longer) and loses only these seconds.
# The deployment may set it (``[taxiway] min_event_delay_s``, AIRFLOW__TAXIWAY__MIN_EVENT_DELAY_S).
MIN_EVENT_DELAY_S = 10.0


def min_event_delay_s() -> float:
    return conf.getfloat("taxiway", "min_event_delay_s", fallback=MIN_EVENT_DELAY_S)


def _ship(report: Callable[[], str | None]) -> str | None:
    """``report`` logged in to MLflow as the deployment's tasks are: the task listener that applies the
    connection (taxiway_airflow/mlflow_connection.py) never runs in the triggerer, so it is applied here."""
    mlflow_connection.apply(quiet=True)
    return report()


def refused(exc: Exception) -> bool:
    """MLflow said no to the caller (401/403: no login, or a user without the permission), or Airflow
    refused the lookup of its connection: trying again will not mend it; anything else (the server away, a timeout) may pass."""
    if isinstance(exc, AirflowSecretsBackendAccessDenied):  # Airflow refused the connection lookup itself
        return True
    code = getattr(exc, "error_code", "")
    return code in ("UNAUTHENTICATED", "PERMISSION_DENIED") or re.search(r"error code (401|403)\b", str(exc)) is not None


async def log_progress(log: Any, report: Callable[[], str | None]) -> None:
    """Run ``report`` (ship new metric lines to MLflow, return the progress line) off the event loop and
    log its line. A failure never fails the watch (the lines stay in ``metrics.jsonl``, go next time,
    and registration logs any left), but it is said every time: an error naming the fix where MLflow
    refused the triggerer, a warning where it may pass."""
    try:
        line = await asyncio.to_thread(_ship, report)
    except Exception as exc:
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        if refused(exc):
            log.error("MLflow refused the live metrics (%s): the triggerer needs MLflow's login, the connection "
                      "named by TAXIWAY_MLFLOW_LOGIN_CONN_ID (docs/deploy.md); until then the curves reach MLflow "
                      "only at registration", why)
        else:
            log.warning("could not ship the live metrics to MLflow yet (%s); they go with the next report", why)
        return
    if line:
        log.info("%s", line)


class GangTrigger(BaseTrigger):
    def __init__(self, watch: dict[str, Any], poll_s: float, report_every_s: float, cancel_grace_s: float,
                 run_id: str) -> None:
        super().__init__()
        self.watch = watch
        self.poll_s = poll_s
        self.report_every_s = report_every_s
        self.cancel_grace_s = cancel_grace_s
        self.run_id = run_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"watch": self.watch, "poll_s": self.poll_s, "report_every_s": self.report_every_s,
                 "cancel_grace_s": self.cancel_grace_s, "run_id": self.run_id})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Watch this trigger's own gang (``watch.gang_id``): if ``gang.json`` already holds a newer
        one, another try owns the run's training and this trigger touches nothing."""
        started = time.monotonic()
        watch = Watch(**self.watch)
        handle = await asyncio.to_thread(local.Handle.load, Path(watch.gang_json))
        if handle.gang_id == watch.gang_id:
            await asyncio.to_thread(local.take_over, handle)
        reported = time.monotonic()
        while True:
            result = await asyncio.to_thread(watch.check)
            if result["state"] != State.RUNNING:
                break
            if time.monotonic() - reported >= self.report_every_s:
                reported = time.monotonic()
                await self._report()
            await asyncio.sleep(self.poll_s)
        if result["state"] not in (State.SUCCEEDED, SUPERSEDED):
            killed = await asyncio.to_thread(LocalLauncher(self.cancel_grace_s).finish, handle)
            result["detail"] += f" (processes killed at cleanup: {killed})"
        if result["state"] != SUPERSEDED:
            await self._report()
        await asyncio.sleep(max(0.0, min_event_delay_s() - (time.monotonic() - started)))
        yield TriggerEvent(result)

    async def _report(self) -> None:
        def report() -> str | None:
            handle = local.Handle.load(Path(self.watch["gang_json"]))
            return train_stage.report(RunFolder.of_gang(handle.path).root, self.run_id, handle.attempt,
                                      handle.started)

        await log_progress(self.log, report)

    async def on_kill(self) -> None:
        """Airflow 3.3's triggerer calls this when a user acted on the deferred task (mark failed or
        success, clear, delete the run), not when the triggerer itself stops: cancel this gang."""
        handle = local.Handle.load(Path(self.watch["gang_json"]))
        if handle.gang_id != self.watch["gang_id"]:  # a newer try already replaced it: not ours to stop
            return
        await asyncio.to_thread(LocalLauncher(self.cancel_grace_s).cancel, handle)
        self.log.info("canceled gang %s: SIGTERM sent; its nodes SIGKILL what is left after %gs",
                      handle.gang_id, self.cancel_grace_s)
