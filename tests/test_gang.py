"""The local gang under attack: kill -9, SIGSTOP, a lost waiting task, a trigger whose gang was
replaced — real processes, real torch.distributed over loopback, real Airflow for the DAG-level
recovery. (A user's cancel, through both of its code paths: tests/test_live_cancel.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from trainer_corpus import gang_pids, write_corpus

from conftest import REPO, TINY, as_deployment, in_task
from pipelines.config import load_config
from pipelines.launch import local
from pipelines.launch.spec import launch_spec, write_trainer_spec
from pipelines.launch.watch import STALLED, Watch


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("gang")
    cfg = load_config(TINY, [*write_corpus(root), "train.steps=100000", "checkpoint.every_steps=5"])
    from pipelines import tokenize

    return cfg, tokenize.pack_splits(cfg).path


def _launch(packed, run_dir: Path) -> local.Handle:
    cfg, path = packed
    write_trainer_spec(cfg, run_dir, path)
    return local.submit(launch_spec(cfg, run_dir))


def _wait_step(run_dir: Path, handle: local.Handle, step: int, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert local.poll(handle).state == local.RUNNING, local.poll(handle).detail
        try:
            status = json.loads((run_dir / "status.json").read_text())
            if status["state"] == "running" and status["step"] >= step:
                return status
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"gang never reached step {step}")


def test_a_trigger_whose_gang_was_replaced_never_touches_the_new_one(packed, tmp_path: Path):
    """A clear lands in an old try's trigger and in the new try at once: the old trigger (its event,
    its cleanup, its ``on_kill``) must stop only its own gang, never the one the new try launched."""
    from taxiway_airflow.triggers.gang import GangTrigger, min_event_delay_s

    run_dir = tmp_path / "replaced"
    old = _launch(packed, run_dir)
    _wait_step(run_dir, old, 1)
    new = _launch(packed, run_dir)  # stops the old gang first, as a relaunching try does
    try:
        _wait_step(run_dir, new, 1)
        trigger = GangTrigger({"gang_json": str(old.path), "gang_id": old.gang_id, "stall_timeout_s": 60,
                               "startup_timeout_s": 120, "deadline": time.time() + 600},
                              poll_s=0.2, report_every_s=30, cancel_grace_s=5, run_id="test")

        async def first_event() -> dict:
            async for event in trigger.run():
                return event.payload

        started = time.monotonic()
        event = asyncio.run(asyncio.wait_for(first_event(), 60))  # bounds a hang, not a speed
        assert event["state"] == "superseded" and new.gang_id in event["detail"], event
        # never sooner than min_event_delay_s(): Airflow 3.3 fails a resumed task whose trigger fired
        # before the deferring try's exit was processed (apache/airflow#72716)
        assert time.monotonic() - started >= min_event_delay_s()
        asyncio.run(trigger.on_kill())
        assert local.cancel_reason(new) is None
        status = _wait_step(run_dir, new, _wait_step(run_dir, new, 1)["step"] + 1)  # still training
        assert status["state"] == "running"
    finally:
        local.cleanup(new, grace_s=10)


def test_stall_is_detected_within_the_stall_timeout(packed, tmp_path: Path):
    run_dir = tmp_path / "stall"
    handle = _launch(packed, run_dir)
    _wait_step(run_dir, handle, 2)
    stall_timeout = 4.0
    watch = Watch(str(handle.path), handle.gang_id, stall_timeout, startup_timeout_s=120, deadline=time.time() + 600)
    assert watch.check()["state"] == local.RUNNING
    stopped = local.processes(handle.gang_id, rank=1)
    assert stopped
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 120  # bounds a hang only
    while (result := watch.check())["state"] == local.RUNNING:
        assert time.monotonic() < deadline, "stall never detected"
        time.sleep(0.25)
    assert result["state"] == STALLED, result
    # when it fires is the watch's own clock, not this machine's speed: never before stall_timeout
    # of no progress, always after
    frozen_since = watch.moved_at
    assert watch.check(now=frozen_since + stall_timeout - 0.01)["state"] == local.RUNNING
    assert watch.check(now=frozen_since + stall_timeout + 0.01)["state"] == STALLED
    local.cleanup(handle, grace_s=3)  # SIGTERM + SIGCONT wake the stopped rank; SIGKILL after 3 s at most
    assert gang_pids(handle.gang_id) == []


def test_starting_up_has_the_startup_budget_and_steps_the_stall_budget():
    """A relaunched node on a busy machine can take longer than ``stall_timeout_s`` to import torch and
    reach the rendezvous: a trainer that says it is starting up is judged on ``startup_timeout_s``
    (a stall there relaunched a healthy gang: stop 46's CI run counted four attempts for three)."""
    from pipelines.launch.watch import look

    started, stall, startup = 1000.0, 6.0, 120.0

    def clock() -> Watch:
        return Watch("gang.json", "g", stall, startup, deadline=started + 600)

    def at(state: str, step: int) -> dict:
        return {"state": state, "step": step, "heartbeat_at": datetime.fromtimestamp(started + 1, UTC).isoformat()}

    starting = clock()
    assert look(starting, at("initializing", 0), started, started + 1) == (True, None)
    assert look(starting, at("initializing", 0), started, started + stall + 30)[1] is None
    fresh, why = look(starting, at("initializing", 0), started, started + startup + 2)
    assert fresh and "compute.startup_timeout_s=120" in why
    running = clock()
    assert look(running, at("running", 5), started, started + 1)[1] is None
    assert "compute.stall_timeout_s=6" in look(running, at("running", 5), started, started + 1 + stall + 0.5)[1]


class _Store:
    """Stand-in for Airflow's task_state_store API (get/set), which lives behind the API server."""

    def __init__(self) -> None:
        self.data: dict = {}

    def get(self, key):
        return self.data.get(key)

    def set(self, key, value, **_):
        self.data[key] = value


class _RunningTI:
    """Stand-in for the task instance's ``get_task_states`` (a call to the API server): this try runs."""

    dag_id, task_id, run_id, map_index = "taxiway_train", "train.gang", "manual__reattach", -1
    stats_tags: dict = {}  # read by ResumableJobMixin (team name in multi-team deployments)

    def get_task_states(self, dag_id, task_ids, run_ids, **_):
        return {run_id: {task_id: "running" for task_id in task_ids} for run_id in run_ids}


def test_lost_waiting_task_reattaches_instead_of_launching_a_second_gang(packed, tmp_path: Path, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from pipelines import stages
    from taxiway_airflow.operators.gang import TrainGang
    from trainer import fsio

    cfg, path = packed
    as_deployment(cfg, tmp_path, monkeypatch)
    with in_task("taxiway_train", "manual__reattach") as run_dir:
        stages.prepare.prepare(cfg, run_dir)
        fsio.write_json(run_dir / "tokenize" / "packed.json", {"path": str(path), "key": "k", "cache_hit": True})
        store = _Store()
        context = {"task_state_store": store, "run_id": "manual__reattach", "ti": _RunningTI()}
        first = TrainGang(task_id="gang", run={"run_dir": str(tmp_path / "elsewhere")})  # an XCom names no folder
        with pytest.raises(TaskDeferred):
            first.execute(context)
        handle = local.Handle.load(local.handle_path(run_dir))
        try:
            _wait_step(run_dir, handle, 1)
            before = sorted(gang_pids(handle.gang_id))
            # The worker holding attempt 1 dies; the retry runs the operator again from scratch.
            second = TrainGang(task_id="gang", run={})
            with pytest.raises(TaskDeferred) as deferred:
                second.execute(context)
            again = local.Handle.load(local.handle_path(run_dir))
            assert again.gang_id == handle.gang_id and again.attempt == 1
            assert sorted(gang_pids(handle.gang_id)) == before
            assert deferred.value.trigger.watch["gang_json"] == str(handle.path)
        finally:
            local.cleanup(handle, grace_s=30)


def _attempts(run_dir: Path) -> str:
    """Each attempt's node exits and log tails: what a failed assertion on the attempt count needs."""
    out = []
    for exit_file in sorted((run_dir / "train" / "logs").glob("attempt-*/node-*.exit.json")):
        log = exit_file.with_name(exit_file.name.replace(".exit.json", ".log"))
        out.append(f"{exit_file.parent.name}/{exit_file.name}: {exit_file.read_text()}\n{local.tail(str(log), 12)}")
    return "\n".join(out)


def _kill_then_stop(run_dir: Path, record: dict) -> None:
    """kill -9 node 1 once a checkpoint exists; after the relaunch, SIGSTOP rank 1 to stall it."""
    def handle(attempt: int) -> local.Handle | None:
        try:
            h = local.Handle.load(local.handle_path(run_dir))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return h if h.attempt == attempt else None

    def status() -> dict:
        try:
            return json.loads((run_dir / "status.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        h = handle(1)
        if h and status().get("step", 0) >= 15:
            os.killpg(h.nodes[1].pid, signal.SIGKILL)
            record["killed_at_step"] = status()["step"]
            break
        time.sleep(0.05)
    while time.monotonic() < deadline:
        h, s = handle(2), status()
        # attempt 2's own progress: written since it started (attempt 1's last line may still be there)
        if (h and s.get("state") == "running" and s.get("step", 0) > record["killed_at_step"]
                and datetime.fromisoformat(s["heartbeat_at"]) >= datetime.fromisoformat(h.started_at)):
            for pid in local.processes(h.gang_id, rank=1):
                os.kill(pid, signal.SIGSTOP)
            record["stopped_at_step"] = s["step"]
            return
        time.sleep(0.05)


@pytest.mark.e2e
def test_dag_survives_a_killed_node_and_a_stall(airflow_db, demo_data, home: Path, capsys, caplog, monkeypatch):
    """kill -9 one node, later SIGSTOP one: the DAG run still succeeds, restarts = 2, every metric line
    reaches MLflow once. (That a resume from a checkpoint trains on bitwise as an uninterrupted run
    does: tests/test_trainer_resume.py.)"""
    from airflow.dag_processing.dagbag import DagBag

    from pipelines import run_folder

    # 60 steps of at least 0.1 s: each attempt runs long enough for the watcher to act on it,
    # however fast the machine
    monkeypatch.setenv("TAXIWAY_TEST_SLOW_RANK", "1:0.1")

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]
    overrides = {"train": {"steps": 60}, "checkpoint": {"every_steps": 10},
                 "compute": {"stall_timeout_s": 6, "startup_timeout_s": 120, "cancel_grace_s": 5}}
    before = set((home / "runs").glob("*/*"))  # run folders: runs/<dag id>/<run>
    record: dict = {}
    watcher = None

    def start_watcher() -> None:
        nonlocal watcher
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            new = [p for p in (home / "runs").glob("*/*") if p not in before]
            if new:
                watcher = threading.Thread(target=_kill_then_stop, args=(new[0], record), daemon=True)
                watcher.start()
                return
            time.sleep(0.2)

    finder = threading.Thread(target=start_watcher, daemon=True)
    finder.start()
    dr = dag.test(run_conf={"config": str(TINY), **overrides})
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    assert str(dr.state) == "success", states
    run_dir = run_folder.run_dir(dr.dag_id, dr.run_id)
    assert "killed_at_step" in record and "stopped_at_step" in record, record

    gang = local.Handle.load(local.handle_path(run_dir))
    status = json.loads((run_dir / "status.json").read_text())
    assert (gang.attempt, status["restarts"], status["state"]) == (3, 2, "succeeded"), (record, _attempts(run_dir))
    out = capsys.readouterr()
    log = out.out + out.err + caplog.text  # where task logs land depends on what configured logging first
    assert "gang attempt 1 failed: node 1 vanished" in log
    stall = re.search(r"gang attempt 2 stalled: no heartbeat and no step progress for (\d+) s", log)
    assert stall and int(stall.group(1)) <= 6 + 3, stall
    assert gang_pids(gang.gang_id) == []

    # Metrics went to the pipeline's MLflow run while training ran (restarts included); registration
    # completed that same run without logging a line twice.
    from pipelines import registry
    from pipelines.run_folder import run_key

    assert registry.shipped_offset(run_dir) == (run_dir / "metrics.jsonl").stat().st_size
    c = registry.client()
    runs = c.search_runs([registry.runs._experiment_id(c, "taxiway-tiny")],
                         filter_string=f"tags.`{registry.RUN_KEY_TAG}` = '{run_key(dr.dag_id, dr.run_id)}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.tags[registry.LIVE_TAG] == "1" and runs[0].data.tags["taxiway.restarts"] == "2"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    history = c.get_metric_history(runs[0].info.run_id, "loss")
    assert sorted(m.step for m in history) == sorted(r["step"] for r in lines if r.get("loss") is not None)
