"""``taxiway_sweep`` on a live Airflow (scheduler, triggerer, api-server, LocalExecutor): triggered over
REST, the members' gangs run as mapped deferrable tasks side by side (``dag.test()`` runs them one
after another and their triggers inline), each member ranked, the best alone registered."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

DAG = "taxiway_sweep"


def _span(ti: dict) -> tuple[float, float]:
    return datetime.fromisoformat(ti["start_date"]).timestamp(), datetime.fromisoformat(ti["end_date"]).timestamp()


@pytest.mark.live
def test_a_sweep_over_rest_trains_its_members_side_by_side_and_registers_the_best(live_airflow):
    from pipelines.run_folder import RunFolder, run_dir

    live = live_airflow
    live.wait_dag(DAG)
    live.unpause(DAG)
    own = live.deployment_config("sweep", "registry:\n  model_name: live-sweep\n")  # the refresh test's champion is not ours
    resp = live.trigger(DAG, {"config": own, "sweep": {"train.lr": [0.005, 0.0005]}, "train": {"steps": 10},
                              "checkpoint": {"every_steps": 10}, "compute": {"nodes": 1}})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    end = live.wait_run(DAG, run_id, timeout_s=240)
    tis = live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances", params={"limit": 200}).json()
    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis["task_instances"]}
    assert end["state"] == "success", states

    gangs = sorted((t for t in tis["task_instances"] if t["task_id"] == "sweep.member.gang"),
                   key=lambda t: t["map_index"])
    assert [(t["map_index"], t["state"], t["try_number"]) for t in gangs] == [(0, "success", 1), (1, "success", 1)]
    (a0, a1), (b0, b1) = map(_span, gangs)
    assert max(a0, b0) < min(a1, b1), f"the two members' gangs did not overlap: {a0, a1} and {b0, b1}"

    folder = RunFolder(run_dir(DAG, run_id, live.taxiway_home))
    ranking = json.loads(folder.sweep_ranking.read_text())
    assert [m["state"] for m in ranking["members"]] == ["evaluated", "evaluated"], ranking
    registered = json.loads(folder.registry_record.read_text())
    assert registered["sweep_member"] == ranking["best"] and registered["version"], registered
    print(f"sweep {run_id}: gangs {a0 - a0:.0f}-{a1 - a0:.0f} s and {b0 - a0:.0f}-{b1 - a0:.0f} s; best member "
          f"{ranking['best']} registered as version {registered['version']}")


@pytest.mark.live
def test_a_sweeps_points_are_a_triggers_values_refused_before_any_stage(live_airflow):
    """Sweep points over REST are a trigger's: a key only the deployment sets (with a ``${VAR}`` value)
    and a grid of millions of points fail the first task on its first try, naming point and key; the
    task's log holds nothing of the worker's environment."""
    from live_airflow import PLANTED_SECRET

    live = live_airflow
    live.wait_dag(DAG)
    live.unpause(DAG)
    cases = {
        "owned": ([{"compute.kubernetes.labels": {"a": "${SECRET_DB_URL}"}}, {"train.lr": 0.01}],
                  "sweep[0].compute.kubernetes.labels: only the deployment sets this"),
        "huge": ({f"train.k{i}": list(range(15)) for i in range(6)}, "11,390,625 member(s); a sweep has 2 to 16"),
    }
    runs = {}
    for name, (spec, _) in cases.items():
        resp = live.trigger(DAG, {"sweep": spec})
        assert resp.status_code == 200, (name, resp.text)
        runs[name] = resp.json()["dag_run_id"]
    for name, run_id in runs.items():
        assert live.wait_run(DAG, run_id, timeout_s=300)["state"] == "failed", name
        ti = live.task_instance(DAG, run_id, "resolve_config")
        assert ti["state"] == "failed" and ti["try_number"] == 1, (name, ti["state"], ti["try_number"])
        log = live.task_log(DAG, run_id, "resolve_config") or ""
        assert cases[name][1] in log and PLANTED_SECRET not in log, (name, log[-2000:])
