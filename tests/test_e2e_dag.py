"""The whole ``taxiway_train`` DAG on the tiny config with ``dag.test()``: real Airflow (SQLite),
real torch.distributed gang over loopback, real MLflow (SQLite)."""

from __future__ import annotations

import json
import os
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


def test_a_model_that_beats_the_floor_becomes_champion_and_a_run_continues_it_under_fsdp(dag, tmp_path: Path,
                                                                                          monkeypatch):
    """The gate can pass: 150 steps learn more than token frequencies (this test's own, empty registry).
    Then ``parent`` through the DAG: the next run continues that version (its weights, optimizer state
    and step count) with ``train.parallel=fsdp`` on one node of two processes, is registered with it as
    its parent, and, its gate failing (the deployment asks for more than 4 steps can gain), ends well
    as ``challenger`` while the champion stays."""
    from mlflow import MlflowClient

    from pipelines.registry import client

    # pack.shard_bytes cuts the demo corpus's 7 file groups into 3 mapped tokenize shards (1.65, 0.80, 0.45 MB)
    unigram = deployment_config(tmp_path, monkeypatch, "eval:\n  floor: unigram\n")
    dr = dag.test(run_conf={"config": unigram, "train": {"steps": 150}, "set": ["pack.shard_bytes=600000"]})
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
    status = json.loads((run_dir / "status.json").read_text())  # two nodes over loopback, each its share
    assert status["state"] == "succeeded" and status["tokens_seen"] == 150 * 8 * 32 * 2, status

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
    assert "model/MLmodel" in {a.path for a in c.list_artifacts(mv.run_id, "model")}  # an MLflow Model of the folder
    artifacts = {a.path for a in c.list_artifacts(mv.run_id, "model/artifacts/model")}
    assert {f"model/artifacts/model/{f}" for f in ("model.safetensors", "tokenizer.json", "model.json")} <= artifacts
    quoted = quote(dr.run_id, safe="")
    assert _links(dr, "register.model_version") == {  # what the UI's buttons open (taxiway_airflow/links.py)
        f"taxiway_link_{target}": f"/taxiway/go/{target}/taxiway_train/{quoted}"
        for target in ("model-version", "mlflow-run", "eval-report")}
    assert _links(dr, "train.gang") == {"taxiway_link_mlflow-run": f"/taxiway/go/mlflow-run/taxiway_train/{quoted}"}

    parent = f"models:/taxiway-tiny-gpt/{reg['version']}"
    (tmp_path / "strict").mkdir()  # the deployment's gate made stricter between the two runs
    strict = deployment_config(tmp_path / "strict", monkeypatch, "eval:\n  floor: unigram\n  min_improvement: 50\n")
    child = dag.test(run_conf={"config": str(strict), "parent": parent, "train": {"steps": 4, "parallel": "fsdp"},
                               "compute": {"nodes": 1, "procs_per_node": 2}})
    assert str(child.state) == "success", _states(child)
    events = [json.loads(line) for line in (_run_dir(child) / "events.jsonl").read_text().splitlines()]
    loaded = next(e for e in events if e["event"] == "parent_loaded")
    started = next(e for e in events if e["event"] == "training_started")
    assert loaded["uri"] == parent and loaded["global_step"] == 150, loaded
    assert (started["world_size"], started["parallel"], started["step"]) == (2, "fsdp", 150), started
    report, reg = _gate(child)
    assert report["baseline"]["version"] == str(mv.version) and not report["passed"], report["reason"]
    challenger = c.get_model_version_by_alias("taxiway-tiny-gpt", "challenger")
    assert str(challenger.version) == reg["version"] and challenger.tags["taxiway.eval.passed"] == "false"
    assert challenger.tags["taxiway.parent_model"] == parent
    assert str(c.get_model_version_by_alias("taxiway-tiny-gpt", "champion").version) == str(mv.version)


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


def test_invalid_conf_is_refused_before_any_stage(dag):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="train"):
        dag.test(run_conf={"config": str(TINY), "train": {"lr": -1}})

    dr = dag.test(run_conf={"config": str(TINY), "set": ["train.lr=-1"]})
    states = _states(dr)
    assert str(dr.state) == "failed"
    assert states["resolve_config"] == "failed" and _tries(dr)["resolve_config"] == 1  # bad input: no retry
    assert all(s in ("upstream_failed", "skipped") for t, s in states.items() if t != "resolve_config"), states
