"""``taxiway_refresh`` end to end with ``dag.test()`` on the tiny config: real Airflow (SQLite), a real
gang over loopback, real MLflow (SQLite). The champion is a tiny model trained in this process and
registered in the test's own registry; new data are standard-library files the demo corpus lacks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from refresh_batches import CHAMPION_STEPS, new_files, register_champion, source

from conftest import TINY, deployment_config

pytestmark = pytest.mark.e2e


@pytest.fixture
def champion(home: Path, base_run: Path) -> str:
    """Version 1 of the tiny model, champion in this test's own registry."""
    uri = register_champion(home, base_run)
    assert uri == "models:/taxiway-tiny-gpt/1"
    return uri


def _land(home: Path, src: Path, batch_id: str):
    from pipelines.refresh import landing

    return landing.land(src, home / "landing", batch_id=batch_id)


def _states(dr) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in dr.get_task_instances()}


def _plan(dr) -> dict:
    from pipelines.run_folder import run_dir

    return json.loads((run_dir(dr.dag_id, dr.run_id) / "refresh" / "plan.json").read_text())


def _skipped(dr) -> None:
    states = _states(dr)
    assert str(dr.state) == "success" and states.pop("plan") == "success", states
    assert set(states.values()) == {"skipped"}, states


def test_a_refresh_continues_the_champion_on_new_data_only(refresh_dag, champion, home: Path, demo_data: Path,
                                                           tmp_path: Path):
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.refresh.assemble import assemble
    from pipelines.refresh.plan import RefreshPlan
    from pipelines.registry import client
    from pipelines.run_folder import Cache, run_dir

    dr = refresh_dag.test()  # nothing landed: skipped (how fast: the live test and bench/refresh_bench.py)
    _skipped(dr)
    assert _plan(dr)["reason"].startswith(f"nothing new since the champion {champion}: 0 new batch(es)")

    _land(home, source(tmp_path / "b1", new_files(demo_data, 0, 24)), "b1")
    _land(home, source(tmp_path / "b2", new_files(demo_data, 30, 12)), "b2")  # two batches, one refresh
    tokens = Cache(home / "cache").tokens("x").parent
    before = set(tokens.iterdir())
    dr = refresh_dag.test()
    assert str(dr.state) == "success", _states(dr)
    folder = run_dir(dr.dag_id, dr.run_id)
    report = json.loads((folder / "eval" / "report.json").read_text())
    assert report["passed"], report["reason"]
    assert {"fixed", "fresh"} <= report["refresh"].keys()

    # only the new files were tokenized; the replayed old documents came from the token cache
    for entry in set(tokens.iterdir()) - before:
        files = json.loads((entry / "meta.json").read_text())["files"]
        assert all(f.startswith(("batches/b1/", "batches/b2/", "fresh/b1/", "fresh/b2/")) for f in files), files
    packed = json.loads((Path(json.loads((folder / "tokenize" / "packed.json").read_text())["path"])
                         / "manifest.json").read_text())
    replay = packed["stats"]["replay"]
    assert replay["documents"] > 0 and replay["groups_reused"] == replay["groups"] > 0, replay
    new_tokens = packed["splits"]["train"]["tokens"] - replay["tokens"]
    assert 0.1 < replay["tokens"] / (replay["tokens"] + new_tokens) < 0.5  # replay_fraction 0.25 of the mixture

    # version 2: the champion's child, global step continued, its batch on the version
    c = client()
    mv = c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")
    assert str(mv.version) == "2" and mv.tags["taxiway.parent_model"] == champion
    assert mv.tags["taxiway.refresh.batches"] == "b1,b2"
    assert float(mv.tags["taxiway.eval.new_data.lower_bound_bpb"]) == pytest.approx(
        report["refresh"]["fresh"]["gate"]["lower_bpb"], abs=1e-6)
    model = json.loads((folder / "model" / "model.json").read_text())
    assert model["global_step"] == CHAMPION_STEPS + 40 and model["parent"] == champion
    ledger = json.loads(Path(c.download_artifacts(mv.run_id, "refresh/ledger.json", str(tmp_path / "l"))).read_text())
    assert [(b["id"], b["version"]) for b in ledger["batches"]] == [("b1", "2"), ("b2", "2")]

    # the same data again under another id: dropped, nothing trained; b1 and b2 are not new any more
    _land(home, tmp_path / "b1", "b1-again")
    dr = refresh_dag.test()
    _skipped(dr)
    assert _plan(dr)["resent"][0]["repeats"] == "b1" and _plan(dr)["new"] == []

    # trained files re-sent under new names: nothing new to train, every task after assemble skipped;
    # later plans drop the batch like a re-send
    src = tmp_path / "b5" / "train"
    src.mkdir(parents=True)
    for i in (5, 6, 7):
        shutil.copyfile(tmp_path / "b1" / "train" / f"f{i:03d}.py.txt", src / f"renamed{i}.py.txt")
    _land(home, src.parent, "b5")
    dr = refresh_dag.test()
    states = _states(dr)
    assert str(dr.state) == "success" and states.pop("plan") == "success" and states.pop("assemble") == "skipped"
    assert set(states.values()) == {"skipped"}, states

    # a re-sent file inside a new batch is dropped as a repeat of trained data, never trained twice
    src = source(tmp_path / "b3", new_files(demo_data, 24, 3))
    shutil.copyfile(tmp_path / "b1" / "train" / "f005.py.txt", src / "train" / "again.py.txt")
    _land(home, src, "b3")
    b3 = tmp_path / "plan-b3"
    decision = stages.refresh.plan(load_config(TINY), b3, "plan-b3")  # as the plan task does
    assert decision.config.parent == "models:/taxiway-tiny-gpt/2"
    assert stages.refresh.plan(load_config(TINY), b3, "plan-b3") == decision  # decided once per run
    assert "b5 dropped: every train document repeats trained data" in decision.reason
    assert str(client().get_model_version_by_alias("taxiway-tiny-gpt", "champion").version) == "2"
    stages.prepare.prepare(decision.config, b3)
    (batch,) = assemble(decision.config, b3, RefreshPlan.load(b3))["batches"]
    assert [d["document"] for d in batch["dropped_documents"]] == ["b3/train/again.py.txt"], batch
    assert batch["dropped_documents"][0]["repeats"] == "b1:train/f005.py.txt"
    # a held-out (val/) document that repeats a trained one is not used to judge the refresh
    src = source(tmp_path / "b4", new_files(demo_data, 27, 3))
    (src / "val").mkdir()
    shutil.copyfile(tmp_path / "b1" / "train" / "f005.py.txt", src / "val" / "seen.py.txt")
    shutil.copyfile(new_files(demo_data, 50, 1)[0], src / "val" / "unseen.py.txt")
    _land(home, src, "b4")
    b4 = tmp_path / "plan-b4"
    decision_b4 = stages.refresh.plan(load_config(TINY), b4, "plan-b4")
    assert "b3 held back" in decision_b4.reason and [b.id for b in RefreshPlan.load(b4).new] == ["b4"]
    (batch,) = assemble(decision_b4.config, b4, RefreshPlan.load(b4))["batches"]
    assert [(d["document"], d["repeats"]) for d in batch["held_out_dropped"]] == [
        ("b4/val/seen.py.txt", "b1:train/f005.py.txt")], batch
    assert sorted(p.name for p in (b4 / "refresh" / "data" / "fresh" / "b4" / "val").iterdir()) == ["unseen.py.txt"]
    # its replay draws on the base corpus and on b1 and b2 as version 2 packed them: all from the cache
    before = set(tokens.iterdir())
    replay = stages.tokenize.reduce(decision.config, b3, RefreshPlan.load(b3)).manifest()["stats"]["replay"]
    assert replay["groups_reused"] == replay["groups"] and replay["groups_left_out"] == 0, replay
    for entry in set(tokens.iterdir()) - before:
        files = json.loads((entry / "meta.json").read_text())["files"]
        assert all(f.startswith(("batches/b3/", "fresh/b3/")) for f in files), files


def test_a_failing_batch_is_not_consumed_and_is_quarantined_after_its_attempts(refresh_dag, champion, home: Path,
                                                                               demo_data: Path, tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch):
    from pipelines.registry import client

    src = source(tmp_path / "bad", new_files(demo_data, 0, 6))
    shutil.copyfile(next((demo_data / "val").iterdir()), src / "train" / "leak.py.txt")  # a val document
    _land(home, src, "bad")
    dr = refresh_dag.test()
    states = _states(dr)
    assert str(dr.state) == "failed" and states["preflight.gate"] == "failed", states
    assert states["register.model_version"] == "upstream_failed", states
    assert len(client().search_model_versions("name = 'taxiway-tiny-gpt'")) == 1

    once = deployment_config(tmp_path, monkeypatch, "refresh:\n  max_attempts: 1\n")  # the deployment's policy
    dr = refresh_dag.test(run_conf={"config": once})
    _skipped(dr)
    (quarantined,) = _plan(dr)["quarantined"]
    assert quarantined["id"] == "bad" and len(quarantined["attempts"]) == 1
    assert "bad quarantined: it took part in 1 failed refresh(es)" in _plan(dr)["reason"]


def test_a_refresh_decontaminates_and_stays_challenger_once_the_champion_left_its_parent(champion, home: Path,
                                                                                          demo_data: Path,
                                                                                          tmp_path: Path):
    """``preflight.action: decontaminate`` in a refresh drops the fixed val document a new batch copies
    and goes on; the refresh is judged against its parent, and when the alias has left that parent
    (removed, or moved to another version) by registration it stays ``challenger``."""
    from pipelines import stages
    from pipelines.config import load_config
    from pipelines.refresh.assemble import assemble
    from pipelines.refresh.plan import RefreshPlan
    from pipelines.registry import client

    leaked = sorted((demo_data / "val").iterdir())[0]
    src = source(tmp_path / "leak", new_files(demo_data, 0, 36))
    shutil.copyfile(leaked, src / "train" / "leak.py.txt")
    _land(home, src, "leak")
    run = tmp_path / "run"
    cfg = stages.refresh.plan(load_config(TINY, ["preflight.action=decontaminate"]), run, "leak-run").config
    stages.prepare.prepare(cfg, run)
    plan = RefreshPlan.load(run)
    assemble(cfg, run, plan)
    gate = stages.preflight.run(cfg, run)
    dropped = gate.decontamination["dropped"]
    assert gate.passed and len(dropped) == 1 and leaked.name in dropped[0], gate.decontamination
    stages.tokenize.reduce(cfg, run, plan)
    stages.train.run(cfg, run)
    (loaded,) = [e for e in map(json.loads, (run / "events.jsonl").read_text().splitlines())
                 if e["event"] == "parent_loaded"]
    assert loaded["optimizer_state"] is None  # version 1 was trained in-process: no full checkpoint anywhere
    report = stages.evaluate.run(cfg, run, refresh=plan)
    assert report["baseline"]["kind"] == "parent" and report["baseline"]["uri"] == champion
    assert report["passed"], report["reason"]

    c, name = client(), "taxiway-tiny-gpt"
    c.delete_registered_model_alias(name, "champion")
    result = stages.register.run(cfg, run, "leak-run", refresh=plan)
    assert result["alias"] == "challenger", result
    assert f"continues {champion}, but no version holds the champion alias now" in result["reason"]
    v1 = c.get_model_version(name, "1")
    other = c.create_model_version(name, v1.source, run_id=v1.run_id)
    c.set_registered_model_alias(name, "champion", other.version)
    result = stages.register.run(cfg, run, "leak-run", refresh=plan)
    assert result["alias"] == "challenger" and f"models:/{name}/{other.version} holds the champion alias" in result["reason"]
    assert str(c.get_model_version_by_alias(name, "champion").version) == str(other.version)
    ledger = json.loads(Path(c.download_artifacts(result["run_id"], "refresh/ledger.json", str(tmp_path / "l"))).read_text())
    # the refresh's full checkpoint is logged with its version: a child continues it from its run
    # folder while that holds it, and from the logged copy once the folder is gone
    from pipelines.run_folder import RunFolder
    from trainer import checkpoint

    child = cfg.model_copy(update={"parent": f"models:/{name}/{result['version']}"})
    weights = stages.parent.weights(child, tmp_path / "child")
    assert stages.parent.checkpoint(child, weights) == RunFolder(run).checkpoints / "step-00000190"
    shutil.rmtree(RunFolder(run).checkpoints)
    logged = stages.parent.checkpoint(child, weights)
    assert logged == weights.with_name(f"{weights.name}-checkpoint") and checkpoint.is_valid(logged) == (True, "ok")
    trained_on = c.get_run(v1.run_id).data.params  # the lineage's corpus, as the champion's run logged it
    assert ledger["base"] == {**{k: trained_on[f"data.{k}"] for k in ("train", "val", "manifest")}, "format": None}

