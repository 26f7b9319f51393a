"""The Taxiway plugin on Airflow's own api-server app (in process, real auth manager, real metadata
DB): the "Training runs" view lists a real ``taxiway_train`` run with what its run folder says, a run's
page, the link routes, and refuses requests without a valid token; the extra links are on the train,
evaluate and register tasks as Airflow serializes them. (``test_live_ui.py`` checks it in a browser.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPO, TINY, tampered_run


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]


@pytest.fixture(scope="module")
def api(airflow_db):
    """Airflow's api-server app with the plugins folder's apps mounted, and an admin's token."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    return client, get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))


def _training_files(folder: Path) -> None:
    """What a trainer halfway through and a finished registration leave (the gang itself is other tests')."""
    from trainer import fsio

    fsio.write_json(folder / "status.json", {
        "state": "running", "step": 50, "total_steps": 200, "tokens_seen": 25600, "loss": 4.25,
        "tokens_per_s": 12345.6, "heartbeat_at": "2026-12-01T17:00:00+00:00",
        "last_checkpoint": str(folder / "checkpoints" / "step-00000050"), "restarts": 1, "error": None})
    lines = [json.dumps({"step": s, "loss": 6.0 - s / 20}) for s in range(5, 55, 5)]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 55, "lo')  # a torn last line
    (folder / "events.jsonl").write_text(json.dumps({"time": "2026-12-01T17:00:00+00:00", "event": "resumed",
                                                     "level": "info", "step": 40}) + "\n")
    fsio.write_json(folder / "registry.json", {"model_name": "taxiway-tiny-gpt", "version": "7", "alias": "challenger",
                                               "run_id": "abc123", "experiment": "taxiway-tiny"})


def test_the_runs_view_shows_a_real_run_behind_airflows_auth(dag, api, home: Path, tmp_path: Path, monkeypatch):
    from pipelines.run_folder import run_dir

    client, token = api
    monkeypatch.setenv("TAXIWAY_MLFLOW_UI_URL", "https://mlflow.example.org/")
    dr, victim = tampered_run(dag, home, tmp_path, monkeypatch)
    folder = run_dir(dr.dag_id, dr.run_id)
    _training_files(folder)

    assert client.get("/taxiway/runs").status_code == 401
    assert client.get("/taxiway/runs", headers={"Authorization": "Bearer forged"}).status_code == 403
    assert client.get(f"/taxiway/runs/taxiway_train/{dr.run_id}").status_code == 401
    assert client.get(f"/taxiway/go/model-version/taxiway_train/{dr.run_id}").status_code == 401

    client.cookies.set("_token", token)  # what the Airflow UI's login leaves in the browser
    rows = {r["run_id"]: r for r in client.get("/taxiway/api/runs").json()}
    row = rows[dr.run_id]
    assert row["state"] == "failed" and row["failure"]["stage"] == "preflight", row
    assert row["note"].startswith("**Failed at preflight**") and row["loss_points"] == 10, row

    html = client.get("/taxiway/runs").text
    mine = html[html.index(f"data-run-id='{dr.run_id}'"):].split("</tr>", 1)[0]
    assert "style='width:25.0%'" in mine and "50/200" in mine, mine  # progress bar and step/total
    assert "<polyline" in mine and "4.2500" in mine and "12,346" in mine, mine  # sparkline, loss, tokens/s
    assert "step-00000050" in mine and ">1<" in mine and "taxiway-tiny-gpt v7" in mine, mine

    page = client.get(f"/taxiway/runs/taxiway_train/{dr.run_id}").text
    assert "Failed at preflight" in page and victim in page and "trigger a new run" in page
    assert "resumed" in page and "manifest" in page and "<polyline" in page  # history, preflight, curve

    go = client.get(f"/taxiway/go/model-version/taxiway_train/{dr.run_id}", follow_redirects=False)
    assert go.headers["location"] == "https://mlflow.example.org/#/models/taxiway-tiny-gpt/versions/7"
    go = client.get(f"/taxiway/go/mlflow-run/taxiway_train/{dr.run_id}", follow_redirects=False)
    assert go.headers["location"] == "https://mlflow.example.org/#/runs/abc123"
    missing = client.get(f"/taxiway/go/eval-report/taxiway_train/{dr.run_id}")
    assert missing.status_code == 404 and "not written yet" in missing.text
    assert client.get("/taxiway/runs/other_dag/x").status_code == 404


def test_extra_links_are_on_the_train_evaluate_and_register_tasks(dag):
    from airflow.serialization.serialized_objects import DagSerialization

    links = {t["__var"]["task_id"]: t["__var"].get("_operator_extra_links", {})
             for t in DagSerialization.to_dict(dag)["dag"]["tasks"]}
    assert set(links["train.gang"]) == {"MLflow run"}
    assert set(links["evaluate.score"]) == {"Eval report", "MLflow run"}
    assert set(links["register.model_version"]) == {"Model version", "MLflow run", "Eval report"}
    assert not links["preflight.gate"]


def test_a_link_is_disabled_until_the_run_folder_holds_its_target(home: Path):
    from airflow.models.taskinstancekey import TaskInstanceKey

    from pipelines.run_folder import RunFolder, run_dir
    from taxiway_airflow.links import EvalReportLink

    key = TaskInstanceKey("taxiway_train", "evaluate.score", "manual__2026-12-01T10:00:00+00:00")
    assert EvalReportLink().get_link(None, ti_key=key) == ""
    report = RunFolder(run_dir(key.dag_id, key.run_id)).eval_report
    report.parent.mkdir(parents=True)
    report.write_text("{}")
    assert EvalReportLink().get_link(None, ti_key=key) == (
        "/taxiway/go/eval-report/taxiway_train/manual__2026-12-01T10%3A00%3A00%2B00%3A00")


def test_a_long_curve_is_thinned_to_its_shape_and_keeps_its_last_point():
    from taxiway_airflow.runs_view.folder import thinned

    points = [(s, 1.0 / s) for s in range(1, 1001)]
    kept = thinned(points, 300)
    assert len(kept) <= 300 and kept[0] == points[0] and kept[-1] == points[-1]
    assert thinned(points[:10], 300) == points[:10]


def test_the_mlflow_run_is_found_by_its_airflow_run_before_registration(airflow_db, home: Path, monkeypatch):
    """While the gang trains, only the MLflow run the trigger ships metrics into exists (tag
    ``taxiway.run_key``); the link finds it there (this test's own SQLite MLflow store)."""
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.registry.client import client
    from pipelines.registry.runs import open_run
    from pipelines.run_folder import run_dir
    from taxiway_airflow.runs_view import mlflow_ui

    monkeypatch.delenv("TAXIWAY_MLFLOW_UI_URL", raising=False)
    run_key = "manual__2026-12-01T11:00:00+00:00"
    folder = run_dir("taxiway_train", run_key)
    cfg = load_config(TINY)
    stages.prepare(cfg, folder)
    assert mlflow_ui.run_url(run_key, folder) is None
    mlflow_run = open_run(client(), cfg, run_key)
    assert mlflow_ui.run_url(run_key, folder) == f"http://127.0.0.1:5000/#/runs/{mlflow_run}"


def test_a_slow_read_answers_503_in_bounded_time_and_fills_the_cache_for_the_next_try(monkeypatch):
    """Shared storage that hangs must not hang the api-server: the request gives up, the read goes on
    in the view's pool, and the next request gets its result from the cache."""
    import asyncio
    import time

    from fastapi import HTTPException

    from taxiway_airflow.runs_view import app

    monkeypatch.setattr(app, "REQUEST_TIMEOUT_S", 0.2)

    def slow() -> str:
        time.sleep(0.6)
        return "read"

    started = time.monotonic()
    with pytest.raises(HTTPException) as refused:
        asyncio.run(app.off_loop(("slow-folder", 1), slow))
    assert refused.value.status_code == 503 and time.monotonic() - started < 0.5
    time.sleep(0.6)
    assert asyncio.run(app.off_loop(("slow-folder", 1), lambda: "computed again")) == "read"
