"""The Taxiway plugin's parts: the extra links on the train, evaluate and register tasks as Airflow
serializes them, links disabled until their target exists, curves thinned, reads bounded in time and
size, no credential in a link. (The view on a real failed run behind Airflow's auth:
``test_failed_run.py``; in a browser: ``test_live_ui.py``.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

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
