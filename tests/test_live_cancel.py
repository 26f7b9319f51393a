"""Cancel stops the training gang, whenever it lands — against a live api-server + scheduler +
dag-processor + triggerer, where the deferred task's trigger runs in the triggerer (``dag.test()``
would run it inline and hide the windows between the two).

A user's action reaches the gang by one of two code paths, whatever the action: while the task is
deferred, the triggerer calls the trigger's ``on_kill``; while it is running, the supervisor's SIGTERM
calls the operator's ``on_kill`` (or the task finds itself no longer running before it defers). A
clear also relaunches. So each path is taken by a state change (mark the run failed; mark the task
success) and by a clear: four cancels on two runs (the running task is frozen right after it launched
the gang, canceled, then let go on). Deleting a running run is refused by Airflow itself. After each:
the gang's processes are gone within ``compute.cancel_grace_s``, the trainer recorded that it honoured
the SIGTERM at or after the step the gang had reached, and that step's checkpoint is valid.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_airflow import wait_for
from live_training import gang_handle, new_gang, stepping, task_process
from trainer_corpus import gang_pids

from pipelines.launch import local
from pipelines.run_folder import run_dir
from trainer import checkpoint

DAG = "taxiway_train"
GANG = "train.gang"
GRACE_S = 20
REPORT_S = 5
CONF = {"train": {"steps": 100000}, "checkpoint": {"every_steps": 5},
        "compute": {"cancel_grace_s": GRACE_S, "report_every_s": REPORT_S}}


class Scenario:
    """One DAG run whose gang is launched, canceled and relaunched again and again."""

    def __init__(self, live, run_id: str) -> None:
        self.live, self.run_id = live, run_id
        self.run_dir = run_dir(DAG, run_id, live.taxiway_home)
        self.gang_id: str | None = None

    def ti(self) -> dict:
        return self.live.task_instance(DAG, self.run_id, GANG)

    def deferred(self) -> bool:
        """True once the gang task is deferred; a try that ended instead fails at once with its log."""
        state = self.ti()["state"]
        if state in ("failed", "success", "up_for_retry", "skipped", "upstream_failed"):
            raise AssertionError(f"expected the gang task to defer; {self.explain()}")
        return state == "deferred"

    def explain(self) -> str:
        """The task's state and the end of this try's log file as the worker wrote it."""
        ti, run = self.ti(), self.live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{self.run_id}").json()
        log = self.live.task_log(DAG, self.run_id, GANG, ti["try_number"]) or "(no log file)"
        return (f"the run is {run.get('state')}, its gang task {ti['state']} (try {ti['try_number']}); "
                f"its log ends:\n{log[-4000:]}")

    def next_gang(self, phase: str) -> tuple[local.Handle, int, int | None]:
        """Wait for the next launch; for ``running`` freeze the task process before it defers."""
        handle = new_gang(self.run_dir, self.gang_id, self.explain)
        self.gang_id = handle.gang_id
        frozen = None
        if phase == "running":
            frozen = task_process(self.ti()["id"])
            os.kill(frozen, signal.SIGSTOP)
            assert self.ti()["state"] == "running"
            step = stepping(self.run_dir, handle, 2)
        else:
            step = stepping(self.run_dir, handle, 2)
            wait_for("the gang task to defer", self.deferred, 60, explain=self.explain)
        return handle, step, frozen

    def assert_stopped(self, handle: local.Handle, step: int, way: str, phase: str) -> None:
        """Gone within the grace; 1.5 × grace when the cancel landed after the task deferred but before
        the triggerer ran the trigger (no on_kill exists yet: the nodes' handoff lease stops them). The
        trainer, not the grace's SIGKILL, ended it: its own ``canceled`` event (rank 0, after this gang
        started), at a step whose checkpoint is valid; no node's torchrun died of a signal."""
        wait_for(f"gang {handle.gang_id} to stop after '{way}' while {phase}",
                 lambda: not gang_pids(handle.gang_id), 1.5 * GRACE_S + 10, every_s=0.2)
        codes = [json.loads(Path(n.exit_file).read_text())["code"] for n in handle.nodes]
        assert all(code >= 0 for code in codes), (way, phase, codes)  # no torchrun SIGKILLed by the grace
        events = [json.loads(line) for line in (self.run_dir / "events.jsonl").read_text().splitlines()]
        canceled = [e for e in events if e["event"] == "canceled" and e["time"] >= handle.started_at]
        assert len(canceled) == 1 and canceled[0]["reason"] == "SIGTERM", (way, phase, canceled)
        stopped_at = canceled[0]["step"]
        assert stopped_at >= step, (way, phase, stopped_at, step)
        assert checkpoint.latest_valid(self.run_dir / "checkpoints").name == f"step-{stopped_at:08d}", (way, phase)

    # the ways -------------------------------------------------------------------------------------
    def cancel(self, way: str) -> None:
        api, base = self.live.api, f"/api/v2/dags/{DAG}/dagRuns/{self.run_id}"
        if way in ("run failed", "run success"):
            resp = api.patch(base, json={"state": way.split()[1]})
        elif way in ("task failed", "task success"):
            resp = api.patch(f"{base}/taskInstances/{GANG}", json={"new_state": way.split()[1]})
        elif way == "clear":
            resp = self.clear()
        else:
            raise ValueError(way)
        assert resp.status_code < 300, (way, resp.status_code, resp.text)

    def clear(self):
        """Clear the gang task and what follows it, and put the run back to running; returns once the
        scheduler took the cleared task up again."""
        resp = self.live.api.post(f"/api/v2/dags/{DAG}/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": self.run_id, "task_ids": [GANG], "include_downstream": True,
            "only_failed": False, "reset_dag_runs": True})
        if resp.status_code < 300:
            wait_for("the cleared gang task to be taken up", lambda: self.ti()["state"] is not None, 120,
                     every_s=0.2, explain=self.explain)
        return resp


def _trigger(live) -> Scenario:
    resp = live.trigger(DAG, CONF)
    assert resp.status_code == 200, resp.text
    return Scenario(live, resp.json()["dag_run_id"])


def _stays_deferred_while_training(scenario: Scenario, watch_s: float = 2.5 * REPORT_S) -> None:
    """Across two of the trigger's report intervals, the gang task never leaves ``deferred``:
    a task woken for each report passes through scheduled/queued, where a cancel reaches neither
    the trigger's nor the task's ``on_kill`` and the gang trains on unwatched."""
    handle = new_gang(scenario.run_dir, scenario.gang_id, scenario.explain)
    stepping(scenario.run_dir, handle, 2)
    wait_for("the gang task to defer", scenario.deferred, 60, explain=scenario.explain)
    start, t0 = stepping(scenario.run_dir, handle, 2), time.monotonic()
    while time.monotonic() - t0 < watch_s:
        state = scenario.ti()["state"]
        assert state == "deferred", f"gang task left 'deferred' for '{state}' while its gang trains"
        time.sleep(0.25)
    assert stepping(scenario.run_dir, handle, start + 1) > start

    def progress_reported() -> bool:  # the trigger's reports (its first one imports MLflow: may lag)
        logs = (scenario.live.home / "logs").glob(f"dag_id={DAG}/run_id={scenario.run_id}/task_id={GANG}/"
                                                  "attempt=1.log.trigger.*.log")
        return any(re.search(r"attempt 1: running step \d+/100000 loss [0-9.]+ tokens/s [0-9.]+", p.read_text())
                   for p in logs)

    wait_for("a progress line from the trigger", progress_reported, 60, every_s=1)


def _cancel_and_check(scenario: Scenario, way: str, phase: str, done: list) -> None:
    handle, step, frozen = scenario.next_gang(phase)
    scenario.cancel(way)
    if frozen:
        os.kill(frozen, signal.SIGCONT)
    scenario.assert_stopped(handle, step, way, phase)
    done.append((way, phase))


def _delete_is_refused(scenario: Scenario, phase: str, done: list) -> None:
    """Airflow 3.3 refuses to delete a running run (409): the gang trains on, untouched; then a
    'run failed' stops it."""
    handle, _, frozen = scenario.next_gang(phase)
    resp = scenario.live.api.delete(f"/api/v2/dags/{DAG}/dagRuns/{scenario.run_id}")
    assert resp.status_code == 409 and "running state" in resp.text, (resp.status_code, resp.text)
    if frozen:
        os.kill(frozen, signal.SIGCONT)
    assert local.poll(handle).state == local.RUNNING and not local.cancel_reason(handle)
    scenario.gang_id = None  # the same gang serves the next cancel
    _cancel_and_check(scenario, "run failed", "deferred", done)


@contextlib.contextmanager
def _one_run(live) -> Iterator[Scenario]:
    """A run for one test; whatever happens, no gang of it trains on beside the next tests."""
    scenario = _trigger(live)
    try:
        yield scenario
    except BaseException:
        if handle := gang_handle(scenario.run_dir):
            local.cleanup(handle, grace_s=5)
        raise
    finally:
        live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{scenario.run_id}", json={"state": "failed"})


@pytest.mark.live
def test_a_cancel_while_deferred_stops_the_gang(live_airflow):
    """The trigger's ``on_kill``: by a clear (which relaunches), then by marking the run failed.
    Deleting the running run in between is refused by Airflow 3.3 itself (HTTP 409), so it can never
    leave a gang behind."""
    done: list = []
    with _one_run(live_airflow) as scenario:
        _stays_deferred_while_training(scenario)
        _cancel_and_check(scenario, "clear", "deferred", done)
        _delete_is_refused(scenario, "deferred", done)
    assert done == [("clear", "deferred"), ("run failed", "deferred")]


@pytest.mark.live
def test_a_cancel_while_running_stops_the_gang(live_airflow):
    """The operator's ``on_kill`` (the task frozen right after it launched the gang): by a clear, on a
    fresh run (Airflow retries a task cleared while running after its retry delay, which grows with
    the try number), then by marking the relaunched task success."""
    done: list = []
    with _one_run(live_airflow) as scenario:
        _cancel_and_check(scenario, "clear", "running", done)
        _cancel_and_check(scenario, "task success", "running", done)
    assert done == [("clear", "running"), ("task success", "running")]
    assert not gang_pids(scenario.gang_id)
