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
    resp = live.trigger(DAG, {"sweep": {"train.lr": [0.005, 0.0005]}, "train": {"steps": 10},
                              "checkpoint": {"every_steps": 10}, "compute": {"nodes": 1}})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    end = live.wait_run(DAG, run_id, timeout_s=600)
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
