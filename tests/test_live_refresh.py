"""``taxiway_refresh`` on a live Airflow: a batch landed with ``taxiway land`` is announced to the
api-server as an asset event (the official ``apache-airflow-client``), the scheduler creates the
refresh run from it, and the run continues the champion into a new champion; a batch landed by
``taxiway_land`` (another DAG whose outlet is the landing asset) starts the next refresh, as does the
README's REST announcement from any other system and the cron (the timetable's next run made due). With
nothing new, a refresh run skips everything after its plan. The deployment's landing zone and MLflow's
artifacts are in its S3 bucket (the tests' own S3 API server): nothing of either is on local disk."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import s3_server
from live_airflow import wait_for
from refresh_batches import new_files, register_champion, source

from conftest import BIN, REPO, taxiway
from pipelines.refresh.landing import MARKER

DAG = "taxiway_refresh"


def _seconds(run: dict) -> float:
    return (datetime.fromisoformat(run["end_date"]) - datetime.fromisoformat(run["start_date"])).total_seconds()


@pytest.mark.live
def test_an_asset_event_from_taxiway_land_refreshes_the_champion(live_airflow, monkeypatch, tmp_path: Path):
    live = live_airflow
    live.wait_dag(DAG)
    live.unpause(DAG)
    live.as_deployment(monkeypatch)  # the live deployment's registry, runs and object storage
    champion = register_champion(live.taxiway_home)
    deployment = {"TAXIWAY_CONFIG": live.init["extra_env"]["TAXIWAY_CONFIG"], "TAXIWAY_HOME": str(live.taxiway_home),
                  **s3_server.env()}  # its landing zone: s3://<bucket>/landing

    src = source(tmp_path / "b1", new_files(live.taxiway_home / "demo-data", 0, 24))
    landed = taxiway("land", str(src), "--batch-id", "b1", check=True, env={
        **deployment, "TAXIWAY_AIRFLOW_URL": live.url, "TAXIWAY_AIRFLOW_USERNAME": "admin",
        "TAXIWAY_AIRFLOW_PASSWORD": live.password})
    assert "announced: asset event" in landed.stdout and f"s3://{live.bucket}/landing/b1" in landed.stdout, landed.stdout

    def asset_run(seen: int = 0):
        runs = live.api.get(f"/api/v2/dags/{DAG}/dagRuns", params={"run_type": "asset_triggered",
                                                                  "order_by": "logical_date"}).json()["dag_runs"]
        return runs[seen] if len(runs) > seen else None

    run = wait_for("the scheduler to create a refresh run from the asset event", asset_run, 120, every_s=1)
    run = live.wait_run(DAG, run["dag_run_id"], timeout_s=240)
    tis = live.task_instances(DAG, run["dag_run_id"])
    assert run["state"] == "success", {k: ti["state"] for k, ti in tis.items()}
    print(f"refresh run {run['dag_run_id']} (asset triggered) took {_seconds(run):.1f}s")

    from pipelines.registry import client

    mv = client().get_model_version_by_alias("taxiway-tiny-gpt", "champion")  # the one live test that registers it
    assert mv.tags["taxiway.parent_model"] == champion and f"models:/{mv.name}/{mv.version}" != champion
    assert mv.tags["taxiway.refresh.batches"] == "b1" and mv.tags["airflow.dag_id"] == DAG
    stored = s3_server.keys(live.bucket)
    assert mv.source.startswith(f"s3://{live.bucket}/mlartifacts/"), mv.source
    assert any(k.endswith("/model.safetensors") and mv.run_id in k for k in stored), "the model is not in the bucket"
    assert f"landing/b1/{MARKER}" in stored and not (live.taxiway_home / "landing").exists()
    assert not (live.taxiway_home / "mlartifacts").exists(), "artifacts were written to local disk"
    model_key = next(k for k in stored if k.endswith("/model.safetensors") and mv.run_id in k)
    print(f"refresh registered {mv.name} v{mv.version} from s3://{live.bucket}/landing/b1 ({len(stored)} keys in "
          f"the bucket); source {mv.source}; weights at s3://{live.bucket}/{model_key}; no landing/ or "
          f"mlartifacts/ under TAXIWAY_HOME")
    events = live.api.get("/api/v2/assets/events", params={"limit": 10}).json()["asset_events"]
    assert any((e.get("extra") or {}).get("batch_id") == "b1" for e in events), events
    # the one attempt on record: b1, tried once against the champion it continued
    attempted = json.loads(Path(os.environ["TAXIWAY_HOME"], "refresh", "attempts.json").read_text())
    assert [(key.split(" ")[0], key.split(" ")[2], len(runs)) for key, runs in attempted.items()] == [
        ("b1", champion, 1)], attempted

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

    # any other system: a batch landed without announcing it (b4, b1's files again), then the README's
    # REST announcement, verbatim, starts the next refresh (nothing new again: it skips)
    src = source(tmp_path / "b4", sorted((tmp_path / "b1" / "train").iterdir())[:6])
    quiet = {k: v for k, v in os.environ.items() if not k.startswith("TAXIWAY_AIRFLOW_")}
    landed = subprocess.run([str(BIN / "taxiway"), "land", str(src), "--batch-id", "b4"], capture_output=True, text=True,
                            env={**quiet, **deployment}, cwd=REPO)
    assert landed.returncode == 0 and "announced" not in landed.stdout, landed.stdout + landed.stderr
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_block("/api/v2/assets/events")], cwd=REPO,
                         env={**os.environ, "AIRFLOW_URL": live.url, "TOKEN": live.token()},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    run = live.wait_run(DAG, wait_for("a refresh run from the README's asset event", lambda: asset_run(2), 120,
                                      every_s=1)["dag_run_id"], timeout_s=300)
    assert run["state"] == "success", live.task_instances(DAG, run["dag_run_id"])

    # the cron: time travel through the timetable (the run it schedules next becomes due now, as if
    # the clock had reached it), and the scheduler starts that scheduled run
    _due_now(live, DAG)
    scheduled = wait_for("the cron's refresh run", lambda: next(iter(live.api.get(
        f"/api/v2/dags/{DAG}/dagRuns", params={"run_type": "scheduled"}).json()["dag_runs"]), None), 120, every_s=1)
    run = live.wait_run(DAG, scheduled["dag_run_id"], timeout_s=300)
    states = {k: ti["state"] for k, ti in live.task_instances(DAG, run["dag_run_id"]).items()}
    assert run["state"] == "success" and states.pop("plan") == "success" and set(states.values()) == {"skipped"}, states
    print(f"nothing new: cron-started refresh run {run['dag_run_id']} took {_seconds(run):.1f}s, every task after "
          "plan skipped")


def _readme_block(holding: str) -> str:
    """The README's one bash block that holds ``holding``."""
    blocks = [b for b in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S) if holding in b]
    assert len(blocks) == 1, f"the README should hold one bash block with {holding}"
    return textwrap.dedent(blocks[0])


def _due_now(live, dag_id: str) -> None:
    """The DAG's next scheduled run, as its timetable computed it, due now: the scheduler creates it on
    its next loop, with the logical date and data interval the timetable gave (nothing else moves)."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(live.init["metadata_uri"])
    try:
        with engine.begin() as conn:
            moved = conn.execute(sqlalchemy.text(
                "UPDATE dag SET next_dagrun_create_after = now() - interval '1 second' "
                "WHERE dag_id = :dag_id AND next_dagrun IS NOT NULL"), {"dag_id": dag_id}).rowcount
    finally:
        engine.dispose()
    assert moved == 1, f"{dag_id} has no next scheduled run"
