"""The whole ``taxiway_train`` DAG on the tiny config with ``dag.test()``: real Airflow (SQLite),
real torch.distributed gang over loopback, real MLflow (SQLite)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import quote

import pytest

from conftest import REPO, TINY, deployment_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def _tries(dr) -> dict[str, int]:
    return {ti.task_id: ti.try_number for ti in dr.get_task_instances()}


def _run_dir(dr) -> Path:
    from pipelines.run_folder import run_dir

    return run_dir(dr.dag_id, dr.run_id)


def _gate(dr) -> tuple[dict, dict]:
    run_dir = _run_dir(dr)
    return (json.loads((run_dir / "eval" / "report.json").read_text()),
            json.loads((run_dir / "registry.json").read_text()))


def test_a_model_that_beats_the_unigram_floor_becomes_champion(dag, tmp_path: Path, monkeypatch):
    """The gate can pass: 300 steps learn more than token frequencies (this test's own, empty registry)."""
    from mlflow import MlflowClient

    from pipelines.registry import client

    # pack.shard_bytes cuts the demo corpus's 7 file groups into 3 mapped tokenize shards (1.65, 0.80, 0.45 MB)
    unigram = deployment_config(tmp_path, monkeypatch, "eval:\n  floor: unigram\n")
    dr = dag.test(run_conf={"config": unigram, "train": {"steps": 300}, "set": ["pack.shard_bytes=600000"]})
    assert str(dr.state) == "success", _states(dr)
    shards = sorted((ti.map_index, str(ti.state)) for ti in dr.get_task_instances() if ti.task_id == "tokenize.shard")
    assert shards == [(0, "success"), (1, "success"), (2, "success")], shards
    encoded = _returned(dr, "tokenize.shard")
    pointer = json.loads((_run_dir(dr) / "tokenize" / "packed.json").read_text())
    stats = json.loads((Path(pointer["path"]) / "manifest.json").read_text())["stats"]
    assert sum(e["groups"] for e in encoded) == stats["groups"] == 7, (encoded, stats)
    # the pack found every group in the cache (or the whole dataset, packed by an earlier test)
    assert pointer["cache_hit"] or stats["groups_reused"] == 7, stats
    report, reg = _gate(dr)
    assert report["baseline"]["kind"] == "floor" and report["baseline"]["floor"] == "unigram", report["baseline"]
    assert report["passed"] and report["gate"]["lower_bpb"] > 0, report["gate"]
    run_dir = _run_dir(dr)

    c: MlflowClient = client()
    mv = c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")
    assert str(mv.version) == reg["version"]
    for tag in ("taxiway.config_sha256", "taxiway.data_manifest_sha256", "taxiway.packed_dataset",
                "taxiway.tokenizer_sha256", "taxiway.code_version", "taxiway.parent_model",
                "airflow.dag_id", "airflow.run_id", "taxiway.eval.bits_per_byte",
                "taxiway.eval.delta_bits_per_byte"):
        assert mv.tags.get(tag), tag
    assert mv.tags["airflow.dag_id"] == "taxiway_train" and mv.tags["airflow.run_id"] == dr.run_id
    assert mv.tags["taxiway.config_sha256"] == (run_dir / "config.sha256").read_text().strip()
    assert c.get_run(mv.run_id).info.artifact_uri.startswith((Path(os.environ["TAXIWAY_HOME"]) / "mlartifacts").as_uri())
    artifacts = {a.path for a in c.list_artifacts(mv.run_id, "model")}
    assert {"model/model.safetensors", "model/tokenizer.json", "model/model.json"} <= artifacts
    quoted = quote(dr.run_id, safe="")
    assert _links(dr, "register.model_version") == {  # what the UI's buttons open (taxiway_airflow/links.py)
        f"taxiway_link_{target}": f"/taxiway/go/{target}/taxiway_train/{quoted}"
        for target in ("model-version", "mlflow-run", "eval-report")}
    assert _links(dr, "train.gang") == {"taxiway_link_mlflow-run": f"/taxiway/go/mlflow-run/taxiway_train/{quoted}"}


def _links(dr, task_id: str) -> dict[str, str]:
    """The extra links the worker stored for a task as XComs when it ended."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(XComModel.key, XComModel.value).where(
            XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id, XComModel.task_id == task_id,
            XComModel.key.like("taxiway_link_%"))).all()
    return {key: _plain(value) for key, value in rows}


def _returned(dr, task_id: str) -> list:
    """What a (mapped) task's instances returned, in map index order."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(XComModel.value).where(
            XComModel.dag_id == dr.dag_id, XComModel.run_id == dr.run_id, XComModel.task_id == task_id,
            XComModel.key == "return_value").order_by(XComModel.map_index)).all()
    return [_plain(value) for value, in rows]


def _plain(value: object) -> object:
    """An XCom value as the api-server's ``XComOperatorLink`` reads it: JSON, else the raw value."""
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def test_a_model_that_does_not_beat_the_unigram_floor_is_only_challenger(dag, tmp_path: Path, monkeypatch):
    """The gate can fail: 5 steps do not learn even token frequencies, so the run ends well (the
    pipeline worked) but the model is registered as challenger and no champion exists."""
    from mlflow.exceptions import MlflowException

    from pipelines.registry import client

    unigram = deployment_config(tmp_path, monkeypatch, "eval:\n  floor: unigram\n")
    dr = dag.test(run_conf={"config": unigram, "train": {"steps": 5}})
    assert str(dr.state) == "success", _states(dr)
    report, reg = _gate(dr)
    assert report["baseline"]["floor"] == "unigram" and not report["passed"], report["reason"]
    c = client()
    challenger = c.get_model_version_by_alias("taxiway-tiny-gpt", "challenger")
    assert str(challenger.version) == reg["version"] and challenger.tags["taxiway.eval.passed"] == "false"
    with pytest.raises(MlflowException, match="alias"):
        c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")


def test_invalid_conf_is_refused_before_any_stage(dag):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="train"):
        dag.test(run_conf={"config": str(TINY), "train": {"lr": -1}})

    dr = dag.test(run_conf={"config": str(TINY), "set": ["train.lr=-1"]})
    states = _states(dr)
    assert str(dr.state) == "failed"
    assert states["resolve_config"] == "failed" and _tries(dr)["resolve_config"] == 1  # bad input: no retry
    assert all(s in ("upstream_failed", "skipped") for t, s in states.items() if t != "resolve_config"), states


def test_bad_data_fails_at_the_preflight_gate_from_three_mapped_shards(dag, home: Path, tmp_path: Path, capsys,
                                                                        monkeypatch):
    """Preflight as mapped tasks (plan → one scan per shard → gate) on a tampered copy of the corpus
    cut into 3 shards: the gate fails naming the file, and every check and the report equal, byte
    for byte, those of one shard per split (``preflight.run``, the CLI's path)."""
    from pipelines import preflight, stages

    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", f"{os.environ['TAXIWAY_DATA_ROOTS']}{os.pathsep}{tmp_path}")  # a second data root
    data = tmp_path / "data"
    shutil.copytree(home / "demo-data", data)
    victim = sorted((data / "val").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\n# tampered\n")
    conf = {"config": str(TINY), "data": {"train": str(data / "train"), "val": str(data / "val"),
                                          "manifest": str(data / "manifest.jsonl")},
            "set": ["preflight.shard_bytes=1500000"]}  # the 160-file corpus: 2 train shards, 1 val
    dr = dag.test(run_conf=conf)
    states = _states(dr)
    assert str(dr.state) == "failed"
    scans = [ti for ti in dr.get_task_instances() if ti.task_id == "preflight.scan"]
    assert len(scans) == 3 and {str(ti.state) for ti in scans} == {"success"}
    assert states["preflight.plan"] == "success" and states["preflight.gate"] == "failed"
    assert _tries(dr)["preflight.gate"] == 1  # a failed check: no retry
    assert states["tokenize.pack"] == "upstream_failed"
    out = capsys.readouterr()
    tail = (out.out + out.err).splitlines()
    assert any(f"val/{victim.name}: size" in line for line in tail[-400:]), "problem not in the task log"

    mapped = _run_dir(dr) / "preflight"
    cfg = stages.load_run_config(_run_dir(dr))
    whole = tmp_path / "whole"
    preflight.run(cfg.model_copy(update={"preflight": cfg.preflight.model_copy(update={"shard_bytes": 1 << 30})}),
                  whole, workers=1)
    assert len(json.loads((whole / "preflight" / "shards.json").read_text())["shards"]) == 2
    for check in ("manifest", "documents", "duplicates", "overlap"):
        assert (mapped / "checks" / f"{check}.json").read_bytes() == (
            whole / "preflight" / "checks" / f"{check}.json").read_bytes(), check
    one, other = (re.sub(r'"created_at": "[^"]*"', "", (folder / "report.json").read_text())
                  for folder in (mapped, whole / "preflight"))
    assert one == other
    assert (mapped / "overlap.png").read_bytes() == (whole / "preflight" / "overlap.png").read_bytes()


def test_registry_outage_is_retried_until_the_store_is_back(dag, home: Path, tmp_path: Path, monkeypatch):
    """MLflow's tracking server is down when registration starts: the task fails as a transient
    failure, Airflow retries it with back-off, and it succeeds once the server is up. The server
    starts with the test behind a relay that refuses connections until the first try has failed, so
    the store comes back then, not whenever a loaded machine finishes starting it."""
    import threading
    from datetime import UTC, datetime

    from airflow.models import TaskInstance
    from airflow.utils.session import create_session
    from live_airflow import free_port, wait_for
    from mlflow_server import mlflow_server
    from tcp_relay import Relay

    started = datetime.now(UTC)

    def first_try_failed() -> bool:  # this test's try: the session's Airflow database holds other runs
        with create_session() as session:
            return session.query(TaskInstance).filter(TaskInstance.task_id == "register.model_version",
                                                      TaskInstance.state == "up_for_retry",
                                                      TaskInstance.start_date >= started).count() > 0

    with mlflow_server(tmp_path / "mlflow") as server:
        relay = Relay(free_port(), server.port)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{relay.port}")
        reopened = threading.Event()

        def bring_the_store_back() -> None:
            wait_for("registration's first try to fail", first_try_failed, 600, every_s=0.2)
            relay.open()
            reopened.set()

        threading.Thread(target=bring_the_store_back, daemon=True).start()
        try:
            floor = deployment_config(tmp_path, monkeypatch, "eval:\n  baseline: floor\n")
            dr = dag.test(run_conf={"config": floor, "registry": {"retries": 1, "retry_backoff_s": 0.1}})
            assert reopened.is_set(), "registration never failed while the store was down"
            assert str(dr.state) == "success", _states(dr)
            tries = _tries(dr)
            assert tries["register.model_version"] >= 2, tries
            assert all(n == 1 for t, n in tries.items() if t != "register.model_version"), tries
            from pipelines.registry import client

            assert client().get_model_version_by_alias("taxiway-tiny-gpt", "champion").version
        finally:
            relay.close()
