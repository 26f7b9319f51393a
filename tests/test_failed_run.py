"""One ``taxiway_train`` run that fails at the preflight gate (``dag.test()``, real Airflow): a copy of
the corpus whose first val file no longer matches the manifest, cut into three preflight shards. It runs
once, and every test here reads it: the gate from its mapped shards, the failure summary (folder, log,
note), and the Training runs view on Airflow's own api-server app."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, SHARED, TINY, run_note


@dataclass(frozen=True)
class Failed:
    run: object        # the DagRun
    victim: str        # the tampered val file's name
    home: Path         # the TAXIWAY_HOME it ran in
    data_roots: str
    logged: list[str]  # every log message of the run


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def failed(airflow_db, demo_data: Path, session_home: Path, tmp_path_factory) -> Failed:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]
    root = tmp_path_factory.mktemp("failed-run")
    home = root / "taxiway-home"
    home.mkdir()
    for name in SHARED:
        (home / name).symlink_to(session_home / name, target_is_directory=True)
    data = root / "data"
    shutil.copytree(demo_data, data)
    victim = sorted((data / "val").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\n# tampered\n")
    roots = os.pathsep.join([str(home), str(demo_data), str(root)])
    deployment = root / "deployment.yaml"  # the deployment's data (its val set is the gate's: docs/security.md)
    deployment.write_text(f"extends: {TINY}\ndata:\n  train: {data / 'train'}\n  val: {data / 'val'}\n"
                          f"  manifest: {data / 'manifest.jsonl'}\n")
    conf = {"set": ["preflight.shard_bytes=1500000"]}  # the 160-file corpus: 2 train shards, 1 val
    collect = _Collect()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TAXIWAY_CONFIG", str(deployment))
        mp.setenv("TAXIWAY_HOME", str(home))
        mp.setenv("TAXIWAY_DATA_ROOTS", roots)
        logging.getLogger().addHandler(collect)
        try:
            run = dag.test(run_conf=conf)
        finally:
            logging.getLogger().removeHandler(collect)
    return Failed(run, victim.name, home, roots, collect.messages)


@pytest.fixture(autouse=True)
def _its_home(failed: Failed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test here reads the failed run's own home."""
    monkeypatch.setenv("TAXIWAY_HOME", str(failed.home))
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", failed.data_roots)


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def test_the_gate_fails_from_three_mapped_shards_as_from_one_shard_per_split(failed: Failed, tmp_path: Path):
    """Preflight as mapped tasks (plan → one scan per shard → gate): the gate fails naming the file, is
    not retried, and every check and the report equal, byte for byte, those of one shard per split
    (``preflight.run``, the CLI's path)."""
    from pipelines import stages
    from pipelines.run_folder import run_dir
    from pipelines.stages import preflight

    dr = failed.run
    states = _states(dr)
    assert str(dr.state) == "failed"
    scans = [ti for ti in dr.get_task_instances() if ti.task_id == "preflight.scan"]
    assert len(scans) == 3 and {str(ti.state) for ti in scans} == {"success"}
    assert states["preflight.plan"] == "success" and states["preflight.gate"] == "failed"
    assert {ti.task_id: ti.try_number for ti in dr.get_task_instances()}["preflight.gate"] == 1  # a failed check
    assert states["tokenize.pack"] == "upstream_failed"
    assert any(f"val/{failed.victim}: size" in line for line in failed.logged), "problem not in the task log"

    folder = run_dir(dr.dag_id, dr.run_id)
    mapped = folder / "preflight"
    cfg = stages.prepare.load_run_config(folder)
    whole = tmp_path / "whole"
    preflight.run(cfg.model_copy(update={"preflight": cfg.preflight.model_copy(update={"shard_bytes": 1 << 30})}),
                  whole, workers=1)
    assert len(json.loads((whole / "preflight" / "shards.json").read_text())["shards"]) == 2
    for check in ("manifest", "documents", "duplicates", "overlap"):
        assert (mapped / "checks" / f"{check}.json").read_bytes() == (
            whole / "preflight" / "checks" / f"{check}.json").read_bytes(), check
    one, other = (re.sub(r'"created_at": "[^"]*"', "", (where / "report.json").read_text())
                  for where in (mapped, whole / "preflight"))
    assert one == other
    assert (mapped / "overlap.png").read_bytes() == (whole / "preflight" / "overlap.png").read_bytes()


def test_the_failure_is_summarized_in_the_folder_the_log_and_the_note(failed: Failed):
    from pipelines.run_folder import RunFolder, run_dir

    dr, victim = failed.run, failed.victim
    summary = json.loads(RunFolder(run_dir(dr.dag_id, dr.run_id)).failure_summary.read_text())
    assert summary["run_id"] == dr.run_id and summary["stage"] == "preflight", summary
    assert summary["task_id"] == "preflight.gate" and summary["kind"] == "check failed"
    assert f"val/{victim}" in summary["reason"] and "\n" not in summary["reason"], summary["reason"]
    assert "manifest" in summary["next"] and "trigger a new run" in summary["next"], summary["next"]
    assert summary["run_folder"] == str(run_dir(dr.dag_id, dr.run_id))

    note = run_note("taxiway_train", dr.run_id)
    assert note and note.startswith("**Failed at preflight**") and f"val/{victim}" in note, note
    failure_lines = [m for m in failed.logged if "TAXIWAY FAILURE at preflight" in m]
    assert failure_lines and f"val/{victim}" in failure_lines[-1] and "next: " in failure_lines[-1]


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


def test_the_runs_view_shows_the_run_behind_airflows_auth(failed: Failed, api, monkeypatch):
    from pipelines.run_folder import run_dir

    client, token = api
    monkeypatch.setenv("TAXIWAY_MLFLOW_UI_URL", "https://mlflow.example.org/")
    dr, victim = failed.run, failed.victim
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
