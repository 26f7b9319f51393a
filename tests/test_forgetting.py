"""Every refresh reports forgetting (issue 35, item 5): parent vs candidate bits/byte on the fixed
validation set and on the held-out slices of the earlier batches its parent was trained on, in the
eval report and as MLflow metrics. Real Airflow ``dag.test()``, a real gang, real MLflow (SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from refresh_batches import new_files, register_champion, source

from conftest import deployment_config

pytestmark = pytest.mark.e2e


def _as_if_trained(home: Path, champion: str, batches: list, seed: int, fraction: float) -> None:
    """The champion's ledger lists ``batches`` as trained by it (as earlier refreshes would have left
    it): every train file but those a refresh holds out, which is what forgetting is scored on."""
    from pipelines import manifest
    from pipelines.refresh.assemble import _held_out
    from pipelines.refresh.ledger import Ledger, trained_data
    from pipelines.registry import client

    c = client()
    mv = c.get_model_version("taxiway-tiny-gpt", champion.rsplit("/", 1)[1])
    trained = {}
    for b in batches:
        entries = manifest.read(Path(b.uri) / "manifest.jsonl")
        train = [e for e in entries if e.split == "train"]
        held = set() if any(e.split == "val" for e in entries) else _held_out(b.id, train, fraction, seed)
        trained[b.id] = [[e.path, e.sha256, False] for e in train if e.path not in held]
    ledger = Ledger(base=trained_data(c.get_run(mv.run_id).data.params)).extended(batches, str(mv.version), trained)
    path = home / "ledger" / "ledger.json"
    path.parent.mkdir()
    path.write_text(ledger.to_json())
    c.log_artifact(mv.run_id, str(path), artifact_path="refresh")


def test_a_refresh_reports_forgetting_on_the_earlier_batches(refresh_dag, base_run: Path, home: Path,
                                                            demo_data: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch):
    from pipelines.config import load_config
    from pipelines.refresh import landing
    from pipelines.registry import client
    from pipelines.run_folder import RunFolder, run_dir

    champion = register_champion(home, base_run)
    with_val = source(tmp_path / "old-val", new_files(demo_data, 40, 4))
    (with_val / "val").mkdir()
    for i, path in enumerate(new_files(demo_data, 44, 2)):
        (with_val / "val" / f"v{i}.py.txt").write_bytes(path.read_bytes())
    older = landing.land(with_val, home / "landing", batch_id="older")
    old = landing.land(source(tmp_path / "old", new_files(demo_data, 0, 8)), home / "landing", batch_id="old")
    config = deployment_config(tmp_path, monkeypatch, "refresh:\n  forgetting_batches: 1\n")
    cfg = load_config(config)
    _as_if_trained(home, champion, [older, old], cfg.train.seed, cfg.refresh.fresh_eval_fraction)
    landing.land(source(tmp_path / "new", new_files(demo_data, 20, 12)), home / "landing", batch_id="new")

    dr = refresh_dag.test(run_conf={"config": config})
    folder = run_dir(dr.dag_id, dr.run_id)
    assert str(dr.state) == "success", {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}
    (earlier,) = json.loads((folder / "refresh" / "assembled.json").read_text())["earlier"]
    assert earlier["batch"] == "old" and earlier["held_out_from"] == "train" and earlier["files"] == 1

    report = json.loads((folder / "eval" / "report.json").read_text())
    fixed, batch = report["forgetting"]["sets"]  # newest first, at most refresh.forgetting_batches
    assert fixed["set"] == "fixed validation" and fixed["parent_bpb"] == report["baseline"]["bits_per_byte"]
    assert batch["batch"] == "old" and batch["version"] == "1" and 0 < batch["parent_bpb"] < 20
    assert batch["delta_bpb"] == pytest.approx(batch["candidate_bpb"] - batch["parent_bpb"])
    assert report["forgetting"]["left_out"] == [{"batch": "older",
                                                 "reason": "beyond refresh.forgetting_batches (1), newest first"}]
    md = (folder / "eval" / "report.md").read_text()
    assert "## Forgetting" in md and "| batch old held-out |" in md and "batch older (beyond" in md

    registered = json.loads(RunFolder(folder).registry_record.read_text())  # champion or challenger: both log it
    metrics = client().get_run(registered["run_id"]).data.metrics
    assert metrics["eval.forgetting.batch.old.candidate_bpb"] == pytest.approx(batch["candidate_bpb"])
    assert metrics["eval.forgetting.fixed.delta_bpb"] == pytest.approx(fixed["delta_bpb"])
