"""The whole ``taxiway_train`` DAG on the tiny config with ``dag.test()``: real Airflow (SQLite),
real torch.distributed gang over loopback, real MLflow (SQLite)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, TINY

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_train"]


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def test_dag_trains_and_registers_champion(dag, home: Path):
    from mlflow import MlflowClient

    from pipelines.registry import client

    dr = dag.test(run_conf={"config": str(TINY)})
    assert str(dr.state) == "success", _states(dr)

    run_dir = next(p for p in (home / "runs").iterdir() if (p / "registry.json").exists())
    reg = json.loads((run_dir / "registry.json").read_text())
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["candidate"]["loss"] < report["baseline"]["loss"]
    assert report["baseline"]["kind"] == "floor"

    c: MlflowClient = client()
    mv = c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")
    assert str(mv.version) == reg["version"]
    for tag in ("taxiway.config_sha256", "taxiway.data_manifest_sha256", "taxiway.packed_dataset",
                "taxiway.tokenizer_sha256", "taxiway.code_version", "taxiway.parent_model",
                "airflow.dag_id", "airflow.run_id", "taxiway.eval.bits_per_byte",
                "taxiway.eval.delta_bits_per_byte"):
        assert mv.tags.get(tag), tag
    assert mv.tags["airflow.dag_id"] == "taxiway_train"
    assert mv.tags["taxiway.config_sha256"] == (run_dir / "config.sha256").read_text().strip()
    assert c.get_run(mv.run_id).info.artifact_uri.startswith((home / "mlartifacts").as_uri())
    artifacts = {a.path for a in c.list_artifacts(mv.run_id, "model")}
    assert {"model/model.safetensors", "model/tokenizer.json", "model/model.json"} <= artifacts


def test_failed_gate_registers_challenger_and_keeps_champion(dag):
    from pipelines.registry import client

    before = client().get_model_version_by_alias("taxiway-tiny-gpt", "champion").version
    dr = dag.test(run_conf={"config": str(TINY), "eval": {"min_improvement": 10.0}})
    assert str(dr.state) == "success", _states(dr)
    c = client()
    assert c.get_model_version_by_alias("taxiway-tiny-gpt", "champion").version == before
    challenger = c.get_model_version_by_alias("taxiway-tiny-gpt", "challenger")
    assert challenger.version != before
    assert challenger.tags["taxiway.eval.passed"] == "false"


def test_invalid_conf_is_refused_before_any_stage(dag):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match="train"):
        dag.test(run_conf={"config": str(TINY), "train": {"lr": -1}})

    dr = dag.test(run_conf={"config": str(TINY), "set": ["train.lr=-1"]})
    states = _states(dr)
    assert str(dr.state) == "failed"
    assert states["resolve_config"] == "failed"
    assert all(s in ("upstream_failed", "skipped") for t, s in states.items() if t != "resolve_config"), states


def test_bad_data_fails_at_the_preflight_task_that_found_it(dag, home: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", f"{home}{os.pathsep}{tmp_path}")  # a deployment's second data root
    data = tmp_path / "data"
    shutil.copytree(home / "demo-data", data)
    victim = sorted((data / "val").iterdir())[0]
    victim.write_bytes(victim.read_bytes() + b"\n# tampered\n")
    conf = {"config": str(TINY), "data": {"train": str(data / "train"), "val": str(data / "val"),
                                          "manifest": str(data / "manifest.jsonl")}}
    dr = dag.test(run_conf=conf)
    states = _states(dr)
    assert str(dr.state) == "failed"
    assert states["preflight.manifest"] == "failed"
    assert states["preflight.documents"] == states["preflight.overlap"] == "success"
    assert states["preflight.gate"] == "failed"
    assert states["tokenize.pack"] == "upstream_failed"
    out = capsys.readouterr()
    tail = (out.out + out.err).splitlines()
    assert any(f"val/{victim.name}: size" in line for line in tail[-400:]), "problem not in the task log"
