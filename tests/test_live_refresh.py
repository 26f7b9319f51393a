"""``taxiway_refresh`` on a live Airflow: a batch landed with ``taxiway land`` is announced to the
api-server as an asset event (the official ``apache-airflow-client``), the scheduler creates the
refresh run from it, and the run continues the champion into a new champion; a batch landed by
``taxiway_land`` (another DAG whose outlet is the landing asset) starts the next refresh. With
nothing new, a refresh run skips everything after its plan."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest
from live_airflow import wait_for
from refresh_batches import new_files, register_champion, source

from conftest import TINY, taxiway

DAG = "taxiway_refresh"


def _seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(run["start_date"])).total_seconds()


@pytest.mark.live
def test_an_asset_event_from_taxiway_land_refreshes_the_champion(live_airflow, monkeypatch, tmp_path: Path):
    live = live_airflow
    live.wait_dag(DAG)
    live.unpause(DAG)
    monkeypatch.setenv("TAXIWAY_HOME", str(live.taxiway_home))  # the live deployment's registry and runs
    champion = register_champion(live.taxiway_home)

    resp = live.trigger(DAG, {})  # nothing landed yet
    assert resp.status_code == 200, resp.text
    idle = live.wait_run(DAG, resp.json()["dag_run_id"], timeout_s=300)
    states = {k: ti["state"] for k, ti in live.task_instances(DAG, idle["dag_run_id"]).items()}
    assert idle["state"] == "success" and states.pop("plan") == "success" and set(states.values()) == {"skipped"}
    print(f"nothing new: refresh run {idle['dag_run_id']} took {_seconds(idle):.1f}s, every task after plan skipped")

    src = source(tmp_path / "b1", new_files(live.taxiway_home / "demo-data", 0, 24))
    landed = taxiway("land", str(src), "--batch-id", "b1", check=True, env={
        "TAXIWAY_CONFIG": str(TINY), "TAXIWAY_HOME": str(live.taxiway_home), "TAXIWAY_AIRFLOW_URL": live.url,
        "TAXIWAY_AIRFLOW_USERNAME": "admin", "TAXIWAY_AIRFLOW_PASSWORD": live.password})
    assert "announced: asset event" in landed.stdout, landed.stdout

    def asset_run(seen: int = 0):
        runs = live.api.get(f"/api/v2/dags/{DAG}/dagRuns", params={"run_type": "asset_triggered",
                                                                  "order_by": "logical_date"}).json()["dag_runs"]
        return runs[seen] if len(runs) > seen else None

    run = wait_for("the scheduler to create a refresh run from the asset event", asset_run, 120, every_s=1)
    run = live.wait_run(DAG, run["dag_run_id"], timeout_s=600)
    tis = live.task_instances(DAG, run["dag_run_id"])
    assert run["state"] == "success", {k: ti["state"] for k, ti in tis.items()}
    print(f"refresh run {run['dag_run_id']} (asset triggered) took {_seconds(run):.1f}s")

    from pipelines.registry import client

    mv = client().get_model_version_by_alias("taxiway-tiny-gpt", "champion")  # other live tests register too
    assert mv.tags["taxiway.parent_model"] == champion and f"models:/{mv.name}/{mv.version}" != champion
    assert mv.tags["taxiway.refresh.batches"] == "b1" and mv.tags["airflow.dag_id"] == DAG
    events = live.api.get("/api/v2/assets/events", params={"limit": 10}).json()["asset_events"]
    assert any((e.get("extra") or {}).get("batch_id") == "b1" for e in events), events
    assert json.loads(Path(os.environ["TAXIWAY_HOME"], "refresh", "attempts.json").read_text())

    # another DAG's outlet: taxiway_land, triggered over REST, lands b2 — b1's files again, so the
    # refresh it starts finds nothing new to train and skips after assemble (quick, and still a run)
    live.wait_dag("taxiway_land")
    live.unpause("taxiway_land")
    src = source(live.taxiway_home / "data" / "incoming" / "b2", sorted((src / "train").iterdir())[:6])
    resp = live.trigger("taxiway_land", {"source": str(src), "batch_id": "b2"})
    assert resp.status_code == 200, resp.text
    assert live.wait_run("taxiway_land", resp.json()["dag_run_id"], timeout_s=120)["state"] == "success"
    run = wait_for("the scheduler to create a refresh run from taxiway_land's outlet", lambda: asset_run(1), 120,
                   every_s=1)
    run = live.wait_run(DAG, run["dag_run_id"], timeout_s=300)
    states = {k: ti["state"] for k, ti in live.task_instances(DAG, run["dag_run_id"]).items()}
    assert run["state"] == "success" and states.pop("plan") == "success" and states.pop("assemble") == "skipped", states
    print(f"refresh run {run['dag_run_id']} (from taxiway_land's outlet) took {_seconds(run):.1f}s")

    # a folder outside the deployment's data roots is refused on the first try, naming the field;
    # nothing lands and no refresh starts
    from pipelines.config import load_config
    from pipelines.refresh import landing

    outside = tmp_path / "b1"
    resp = live.trigger("taxiway_land", {"source": str(outside), "batch_id": "b3"})
    assert resp.status_code == 200, resp.text
    refused = live.wait_run("taxiway_land", resp.json()["dag_run_id"], timeout_s=120)
    land = live.task_instance("taxiway_land", refused["dag_run_id"], "land")
    assert refused["state"] == "failed" and (land["state"], land["try_number"]) == ("failed", 1), land
    log = live.task_log("taxiway_land", refused["dag_run_id"], "land") or ""
    assert f"source: {str(outside)!r} is outside the data roots" in log, log[-2000:]
    assert "b3" not in [b.id for b in landing.scan(load_config(TINY).refresh.landing)[0]]
    assert asset_run(2) is None
