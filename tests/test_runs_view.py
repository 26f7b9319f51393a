"""The Taxiway plugin's parts: the extra links on the train, evaluate and register tasks as Airflow
serializes them, links disabled until their target exists, curves thinned, reads bounded in time and
size, no credential in a link. (The view on a real failed run behind Airflow's auth:
``test_failed_run.py``; in a browser: ``test_live_ui.py``.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import REPO, TINY


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]


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
    stages.prepare.prepare(cfg, folder)
    assert mlflow_ui.run_url(run_key, folder) is None
    mlflow_run = open_run(client(), cfg, run_key)
    assert mlflow_ui.run_url(run_key, folder) == f"http://127.0.0.1:5000/#/runs/{mlflow_run}"


def test_a_slow_read_answers_503_in_bounded_time_and_fills_the_cache_for_the_next_try(monkeypatch):
    """Shared storage that hangs must not hang the api-server: the request gives up, the read goes on
    in the view's pool, and the next request gets its result from the cache. The read hangs until the
    503 has come back, so an answer that waited for it could not come at all."""
    import asyncio
    import threading

    from fastapi import HTTPException
    from live_airflow import wait_for

    from taxiway_airflow.runs_view import app

    monkeypatch.setattr(app, "REQUEST_TIMEOUT_S", 0.2)

    storage_answers = threading.Event()

    def slow() -> str:
        assert storage_answers.wait(30)
        return "read"

    with pytest.raises(HTTPException) as refused:
        asyncio.run(app.off_loop(("slow-folder", 1), slow))
    assert refused.value.status_code == 503
    storage_answers.set()
    wait_for("the slow read to fill the cache", lambda: ("slow-folder", 1) in app._cache._entries, 30, every_s=0.05)
    assert asyncio.run(app.off_loop(("slow-folder", 1), lambda: "computed again")) == "read"


def _bytes_read() -> int:
    """Bytes this process has read so far, whatever it read them with (Linux's ``rchar``)."""
    return int(re.search(r"rchar: (\d+)", Path("/proc/self/io").read_text())[1])


def test_a_long_runs_curve_and_history_are_read_within_a_bound_whatever_the_files_size(tmp_path: Path):
    """A long run's metrics.jsonl passes 40 MB (read whole: 2.7 s and 450 MB per row, every few seconds):
    the view reads a bounded share of it and still shows the whole curve, first step to last, and
    the newest events."""
    from taxiway_airflow.runs_view import folder as run_files

    steps, ranks = 100_000, [0.12345] * 16  # 16 ranks: a line as long as a 16-node gang's
    with (tmp_path / "metrics.jsonl").open("w") as fh:
        for s in range(1, steps + 1):
            fh.write(json.dumps({"time": "2026-12-01T17:00:00+00:00", "step": s, "loss": 10 - s / steps, "lr": 3e-4,
                                 "rank_step_time_s": ranks}) + "\n")
        fh.write('{"step": 100001, "lo')  # the trainer appending
    events = [json.dumps({"time": f"t{i}", "event": "loss_spike", "level": "warning", "step": i}) for i in range(60_000)]
    (tmp_path / "events.jsonl").write_text("\n".join(events) + "\n")
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert size > 20 * (run_files.CURVE_BYTES + run_files.EVENTS_BYTES)

    before = _bytes_read()
    files = run_files.read(tmp_path, with_events=True)
    read = _bytes_read() - before

    assert read <= run_files.CURVE_BYTES + run_files.EVENTS_BYTES + 16_384, (read, size)
    points = files.losses
    assert points[0] == (1, 10 - 1 / steps) and points[-1] == (steps, 9.0), points[-3:]
    assert run_files.MAX_POINTS // 2 <= len(points) <= run_files.MAX_POINTS, len(points)
    gaps = [b[0] - a[0] for a, b in zip(points, points[1:], strict=False)]
    assert min(gaps) > 0 and max(gaps) <= 2 * steps / len(points), (min(gaps), max(gaps))  # spread over the run
    assert [e["step"] for e in files.events] == list(range(60_000 - run_files.MAX_EVENTS, 60_000))


def test_no_credential_in_the_mlflow_address_reaches_the_browser(airflow_db, monkeypatch):
    """The links redirect the browser to the MLflow UI: a tracking URI's or a configured address's
    userinfo and token parameters are the api-server's, never the browser's."""
    from taxiway_airflow.runs_view import mlflow_ui

    expected = "https://mlflow.example.org/#/models/m/versions/1"
    monkeypatch.delenv("TAXIWAY_MLFLOW_UI_URL", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://user:s3cr3t@mlflow.example.org/?token=s3cr3t")
    assert mlflow_ui.model_version_url("m", "1") == expected
    monkeypatch.setenv(f"AIRFLOW_CONN_{mlflow_ui.CONNECTION_ID.upper()}",
                       json.dumps({"conn_type": "http", "host": "https://s3cr3ttoken@mlflow.example.org"}))
    assert mlflow_ui.model_version_url("m", "1") == expected
    monkeypatch.setenv("TAXIWAY_MLFLOW_UI_URL", "https://s3cr3ttoken:x-oauth-basic@mlflow.example.org/")
    assert mlflow_ui.model_version_url("m", "1") == expected


def test_a_run_page_names_paths_under_taxiway_home_by_the_variable_not_the_machines_path(home: Path):
    """The page (and its screenshots in docs/) shows ``$TAXIWAY_HOME/runs/…``, never where this
    deployment's home happens to lie."""
    from pipelines.run_folder import run_dir, taxiway_home
    from taxiway_airflow.runs_view import folder as run_files
    from taxiway_airflow.runs_view.render import RunRow, run_page

    folder = run_dir("taxiway_train", "manual__1")
    folder.mkdir(parents=True)
    (folder / "events.jsonl").write_text(json.dumps(
        {"time": "2026-12-04T20:48:49+00:00", "event": "exported", "level": "info",
         "path": str(folder / "model"), "global_step": 30}) + "\n")
    page = run_page(RunRow("taxiway_train", "manual__1", "success", None, None, run_files.read(folder, True)), "")
    assert str(taxiway_home()) not in page
    assert f"run folder $TAXIWAY_HOME/{folder.relative_to(taxiway_home())}" in page
    assert f"path=$TAXIWAY_HOME/{(folder / 'model').relative_to(taxiway_home())}" in page


@pytest.fixture(scope="module")
def api(airflow_db):
    """Airflow's api-server app with the plugins folder's apps mounted, and tokens of an admin and of a
    viewer (who may read DAG runs, not edit them)."""
    from airflow.api_fastapi.app import create_app, get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
    from fastapi.testclient import TestClient

    client = TestClient(create_app())  # initialises the auth manager
    return client, {role: get_auth_manager().generate_jwt(SimpleAuthManagerUser(username=role, role=role))
                    for role in ("admin", "viewer")}


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_batches_page_lists_the_landing_zone_and_only_an_editor_releases(api, home: Path, tmp_path: Path):
    from test_batches import champion_with_ledger, land_texts

    from pipelines.refresh import attempts
    from taxiway_airflow.runs_view import app

    client, tokens = api
    app._cache.drop(("batches",))  # another test's landing zone, read within the cache's few seconds
    champion = champion_with_ledger(tmp_path, [])
    bad = land_texts(home, tmp_path / "q", "bad", {"f.txt": "keeps failing\n"})
    land_texts(home, tmp_path / "n", "fine", {"g.txt": "fine document\n"})
    for run in ("r1", "r2", "r3"):
        attempts.take([bad], run, champion, 3)

    for method, path in (("GET", "/taxiway/batches"), ("GET", "/taxiway/api/batches"),
                         ("POST", "/taxiway/api/batches/bad/release"), ("POST", "/taxiway/batches/bad/release")):
        assert client.request(method, path).status_code == 401, path
        assert client.request(method, path, headers=_as("forged")).status_code == 403, path
    viewer, admin = _as(tokens["viewer"]), _as(tokens["admin"])
    assert client.post("/taxiway/api/batches/bad/release", headers=viewer).status_code == 403
    assert client.post("/taxiway/batches/bad/release", headers=viewer).status_code == 403

    listing = client.get("/taxiway/api/batches", headers=viewer).json()
    assert listing["champion"] == champion and listing["total"] == 2
    assert {b["id"]: b["state"] for b in listing["batches"]} == {"bad": "quarantined", "fine": "new"}
    page = client.get("/taxiway/batches", headers=viewer).text
    row = page[page.index("data-batch-id='bad'"):].split("</tr>", 1)[0]
    assert "quarantined" in row and "r1, r2, r3" in row and "/taxiway/batches/bad/release" in row, row
    assert "action='/taxiway/batches/fine/release'" not in page

    refused = client.post("/taxiway/api/batches/fine/release", headers=admin)
    assert refused.status_code == 409 and "batch fine is new, not quarantined" in refused.json()["detail"]
    assert client.post("/taxiway/api/batches/nothing/release", headers=admin).status_code == 404
    probe = client.post("/taxiway/api/batches/..%2F..%2Fetc/release", headers=admin)
    assert probe.status_code == 404 and "etc" not in probe.text  # never a path, never echoed

    done = client.post("/taxiway/batches/bad/release", headers=admin)  # the page's form
    assert done.status_code == 200 and "Released batch bad: 3 failed attempt(s)" in done.text
    assert "released by admin at" in done.text
    (record,) = {b["id"]: b for b in client.get("/taxiway/api/batches", headers=viewer).json()["batches"]}[
        "bad"]["releases"]
    assert record["by"] == "admin" and record["attempts"] == ["r1", "r2", "r3"]
    again = client.post("/taxiway/api/batches/bad/release", headers=admin)
    assert again.status_code == 409 and "batch bad is new" in again.json()["detail"]


@pytest.fixture(scope="module")
def synced_dags(airflow_db):
    """The DAG folder's DAGs in the metadata database, as the DAG processor leaves them (the runs list
    shows the DAGs a user may read, and those are the database's)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db

    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    for bundle in manager.get_all_dag_bundles():
        bundle.initialize()
        sync_bag_to_db(BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, bundle_name=bundle.name),
                       bundle.name, bundle.version)


def test_an_approval_waiting_for_a_person_is_listed_with_its_run_version_and_airflows_page(api, synced_dags,
                                                                                            home: Path):
    """A ``register.approval`` task waiting for its response (a ``hitl_detail`` row, as the
    human-in-the-loop operator leaves it) is on the runs page and in ``/api/approvals``; once answered,
    it is not."""
    from datetime import UTC, datetime, timedelta

    from airflow.models.dagrun import DagRun
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunType

    from pipelines.run_folder import run_dir
    from taxiway_airflow.runs_view import app
    from trainer import fsio

    client, tokens = api
    run_id = f"manual__approval-{home.parent.name}"
    with DAG("taxiway_refresh", schedule=None):
        task = EmptyOperator(task_id="register.approval")
    fsio.write_json(run_dir("taxiway_refresh", run_id) / "registry.json",
                    {"model_name": "taxiway-tiny-gpt", "version": "4", "alias": "challenger"})
    asked = datetime.now(UTC) - timedelta(hours=2, minutes=5)
    with create_session() as session:
        session.add(DagRun("taxiway_refresh", run_id, run_type=DagRunType.MANUAL, state=DagRunState.RUNNING,
                           run_after=asked, start_date=asked))
        ti = TaskInstance(task, dag_version_id=None, run_id=run_id, state=TaskInstanceState.DEFERRED)
        session.add(ti)
        session.flush()
        session.add(HITLDetail(ti_id=ti.id, options=["Approve", "Reject"], subject="Promote models:/taxiway-tiny-gpt/4?",
                               created_at=asked))
        ti_id = ti.id

    viewer = _as(tokens["viewer"])
    assert client.get("/taxiway/api/approvals").status_code == 401
    app._cache.drop(("approvals", "viewer"))
    (waiting,) = [a for a in client.get("/taxiway/api/approvals", headers=viewer).json() if a["run_id"] == run_id]
    assert waiting["model_version"] == "models:/taxiway-tiny-gpt/4" and 2 * 3600 < waiting["waited_s"] < 3 * 3600
    assert waiting["link"] == (f"/dags/taxiway_refresh/runs/{quote(run_id, safe='')}/tasks/register.approval/"
                               "required_actions")
    app._cache.drop(("runs", "viewer"))
    app._cache.drop(("approvals", "viewer"))
    page = client.get("/taxiway/runs", headers=viewer).text
    row = page[page.index(f"<tr class='approval' data-run-id='{run_id}'"):].split("</tr>", 1)[0]
    assert "Promote models:/taxiway-tiny-gpt/4?" in row and "2 h 5 min" in row and "required_actions" in row, row
    assert "href='/taxiway/batches'" in page  # the header's link to the batches page

    with create_session() as session:
        session.get(HITLDetail, ti_id).responded_at = datetime.now(UTC)
    app._cache.drop(("approvals", "viewer"))
    assert run_id not in {a["run_id"] for a in client.get("/taxiway/api/approvals", headers=viewer).json()}
