"""The ``taxiway_sweep`` DAG on the tiny config with ``dag.test()``: two mapped members trained on one
preflight and one tokenize, ranked on the same val set, the best alone registered, every member a
child MLflow run of the sweep's run (real Airflow, real gangs over loopback, real MLflow on SQLite)."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, TINY, run_note

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dag(airflow_db, demo_data):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_sweep"]


def test_members_train_apart_are_ranked_and_only_the_best_is_registered(dag):
    """Three points: two train and are evaluated, the third (a learning rate that overflows the
    optimizer) fails at its smoke test; the sweep goes on and lists it as failed."""
    from mlflow.exceptions import MlflowException

    from pipelines.registry import RUN_KEY_TAG, client
    from pipelines.run_folder import RunFolder, run_dir, run_key
    from taxiway_airflow.runs_view import folder as run_files
    from taxiway_airflow.runs_view import render

    sweep = [{"train.lr": 0.005}, {"train.lr": 0.0002, "model.n_layer": 1}, {"train.lr": 1e38}]  # one-node gangs
    dr = dag.test(run_conf={"config": str(TINY), "sweep": sweep, "train": {"steps": 10},
                            "checkpoint": {"every_steps": 10}, "compute": {"nodes": 1}})
    tis = dr.get_task_instances()
    states = {(t.task_id, t.map_index): str(t.state) for t in tis}
    assert str(dr.state) == "success", states
    assert [states[("sweep.member.score", i)] for i in range(3)] == ["success", "success", "upstream_failed"]
    assert states[("sweep.member.smoke", 2)] == "failed" and states[("sweep.rank", -1)] == "success"
    assert {t.task_id for t in tis if t.task_id.startswith(("preflight.", "tokenize."))} == {
        "preflight.plan", "preflight.scan", "preflight.gate", "tokenize.tokenizer", "tokenize.shard",
        "tokenize.pack"}  # once, not per member
    assert all(t.map_index == -1 for t in tis if t.task_id.startswith(("preflight.", "tokenize."))
               and t.task_id not in ("preflight.scan", "tokenize.shard"))  # mapped over shards, not members

    folder = RunFolder(run_dir(dr.dag_id, dr.run_id))
    ranking = json.loads(folder.sweep_ranking.read_text())
    rows, failed = ranking["members"][:2], ranking["members"][2]
    bpb = {r["member"]: json.loads(RunFolder(folder.sweep_member(int(r["member"]))).eval_report.read_text())
           ["candidate"]["bits_per_byte"] for r in rows}
    assert [r["state"] for r in rows] == ["evaluated", "evaluated"] and [r["rank"] for r in rows] == [1, 2]
    assert (failed["member"], failed["state"]) == ("02", "failed") and "no evaluation report" in failed["reason"]
    # the member's failure is summarized as the member's: in its folder and a note saying the sweep went on
    summary = json.loads(RunFolder(folder.sweep_member(2)).failure_summary.read_text())
    assert (summary["member"], summary["task_id"], summary["kind"]) == ("02", "sweep.member.smoke", "check failed")
    assert not folder.failure_summary.exists(), "a member's failure is not the sweep's"
    note = run_note("taxiway_sweep", dr.run_id)
    assert note.startswith("**Sweep member 02 failed**") and "goes on with the other members" in note, note
    assert [r["member"] for r in rows] == sorted(bpb, key=bpb.get) and ranking["best"] == rows[0]["member"]
    assert [r["point"] for r in sorted(ranking["members"], key=lambda r: r["member"])] == sweep
    assert {json.loads((folder.sweep_member(i) / "tokenize" / "packed.json").read_text())["path"]
            for i in (0, 1)} == {json.loads(folder.packed_link.read_text())["path"]}  # one packed dataset
    table = folder.sweep_ranking_summary.read_text()
    assert "| 1 | " + ranking["best"] in table and "| – | 02 |" in table

    c = client()
    exp = c.get_experiment_by_name("taxiway-tiny")
    (parent,) = c.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key(dr.dag_id, dr.run_id)}'")
    assert parent.data.tags["taxiway.sweep"] == "parent" and parent.info.status == "FINISHED"
    children = c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_member = {r.data.tags["taxiway.sweep"]: r for r in children}
    assert {m: r.info.status for m, r in by_member.items()} == {"00": "FINISHED", "01": "FINISHED", "02": "FAILED"}
    for member, point in (("00", sweep[0]), ("01", sweep[1])):
        run = by_member[member]
        assert all(run.data.params[k] == str(v) for k, v in point.items()), run.data.params
        assert run.data.metrics["eval.candidate.bits_per_byte"] == pytest.approx(bpb[member])

    (version,) = c.search_model_versions("name = 'taxiway-tiny-gpt'")  # only the best is a model version
    reg = json.loads(folder.registry_record.read_text())
    assert version.run_id == by_member[ranking["best"]].info.run_id and str(version.version) == reg["version"]
    assert reg["sweep_member"] == ranking["best"] and reg["parent_run_id"] == parent.info.run_id
    assert version.tags["airflow.dag_id"] == "taxiway_sweep" and version.tags["airflow.run_id"] == dr.run_id
    passed = rows[0]["gate_passed"]
    assert reg["alias"] == ("champion" if passed else "challenger")
    if passed:
        assert str(c.get_model_version_by_alias("taxiway-tiny-gpt", "champion").version) == reg["version"]
    else:
        with pytest.raises(MlflowException, match="alias"):
            c.get_model_version_by_alias("taxiway-tiny-gpt", "champion")

    files = run_files.read(folder.root)  # the runs view's row: the best member's gate, a link to the ranking
    assert files.ranking["best"] == ranking["best"] and files.decision == ("passed" if passed else "failed")
    links = render.run_links(render.RunRow("taxiway_sweep", dr.run_id, "success", None, None, files), "")
    assert "/go/sweep-ranking/taxiway_sweep/" in links and f"v{reg['version']}" in links

    from pipelines.sweep import registration  # a retried register task: the same runs and version, none added

    again = registration.register(folder.root, run_key(dr.dag_id, dr.run_id), {"dag_id": "taxiway_sweep", "run_id": dr.run_id})
    assert (again["version"], again["parent_run_id"]) == (reg["version"], reg["parent_run_id"])
    assert len(c.search_model_versions("name = 'taxiway-tiny-gpt'")) == 1
    assert len(c.search_runs([exp.experiment_id])) == 4  # the parent and its three members
