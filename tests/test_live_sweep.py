"""``taxiway_sweep`` on a live Airflow (scheduler, triggerer, api-server, LocalExecutor): triggered over
REST, the members' gangs run as mapped deferrable tasks side by side (``dag.test()`` would run them one
after another and their triggers inline), a failing member goes into the ranking as failed, each member
is a child MLflow run, the best alone registered. The one sweep run of the suite."""

from __future__ import annotations

import json
from datetime import datetime

import pytest
from live_airflow import settings

DAG = "taxiway_sweep"
MODEL = "live-sweep"


def _span(ti: dict) -> tuple[float, float]:
    return datetime.fromisoformat(ti["start_date"]).timestamp(), datetime.fromisoformat(ti["end_date"]).timestamp()


@pytest.mark.live
def test_a_sweep_over_rest_trains_its_members_side_by_side_and_registers_the_best(live_airflow, monkeypatch):
    """Three points: two train side by side and are evaluated, the third (a learning rate that overflows
    the optimizer) fails at its smoke test; the sweep goes on and lists it as failed. One preflight and
    one tokenize; every member a child MLflow run of the sweep's run; the best alone registered."""
    from mlflow.exceptions import MlflowException

    from pipelines.registry import RUN_KEY_TAG, client
    from pipelines.run_folder import RunFolder, run_dir, run_key
    from pipelines.sweep import registration
    from taxiway_airflow.runs_view import folder as run_files
    from taxiway_airflow.runs_view import render

    live = live_airflow
    live.wait_dag(DAG)
    live.unpause(DAG)
    live.as_deployment(monkeypatch)  # the live deployment's registry and runs
    own = settings(f"registry:\n  model_name: {MODEL}\n")  # the refresh test's champion is not ours
    # one-node gangs; 1e18, not more: PostgreSQL's jsonb turns a conf's 1e38 into an integer no task can start with
    sweep = [{"train.lr": 0.005}, {"train.lr": 0.0002, "model.n_layer": 1}, {"train.lr": 1e18}]
    resp = live.trigger(DAG, {**own, "sweep": sweep, "train": {"steps": 10},
                              "checkpoint": {"every_steps": 10}, "compute": {"nodes": 1}})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    end = live.wait_run(DAG, run_id, timeout_s=240)
    tis = live.api.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances", params={"limit": 200}).json()
    states = {(t["task_id"], t["map_index"]): t["state"] for t in tis["task_instances"]}
    assert end["state"] == "success", states
    assert [states[("sweep.member.score", i)] for i in range(3)] == ["success", "success", "upstream_failed"]
    assert states[("sweep.member.smoke", 2)] == "failed" and states[("sweep.rank", -1)] == "success"
    assert {t for t, _ in states if t.startswith(("preflight.", "tokenize."))} == {
        "preflight.plan", "preflight.scan", "preflight.gate", "tokenize.tokenizer", "tokenize.shard",
        "tokenize.pack"}  # once, not per member
    assert all(i == -1 for t, i in states if t.startswith(("preflight.", "tokenize."))
               and t not in ("preflight.scan", "tokenize.shard"))  # mapped over shards, not members

    gangs = sorted((t for t in tis["task_instances"] if t["task_id"] == "sweep.member.gang" and t["map_index"] < 2),
                   key=lambda t: t["map_index"])
    assert [(t["map_index"], t["state"], t["try_number"]) for t in gangs] == [(0, "success", 1), (1, "success", 1)]
    (a0, a1), (b0, b1) = map(_span, gangs)
    assert max(a0, b0) < min(a1, b1), f"the two members' gangs did not overlap: {a0, a1} and {b0, b1}"

    folder = RunFolder(run_dir(DAG, run_id, live.taxiway_home))
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
    note = live.dag_run(DAG, run_id)["note"]
    assert note.startswith("**Sweep member 02 failed**") and "goes on with the other members" in note, note
    assert [r["member"] for r in rows] == sorted(bpb, key=bpb.get) and ranking["best"] == rows[0]["member"]
    assert [r["point"] for r in sorted(ranking["members"], key=lambda r: r["member"])] == sweep
    assert {json.loads((folder.sweep_member(i) / "tokenize" / "packed.json").read_text())["path"]
            for i in (0, 1)} == {json.loads(folder.packed_link.read_text())["path"]}  # one packed dataset
    table = folder.sweep_ranking_summary.read_text()
    assert "| 1 | " + ranking["best"] in table and "| – | 02 |" in table

    c = client()
    exp = c.get_experiment_by_name("taxiway-tiny")
    (parent,) = c.search_runs([exp.experiment_id], filter_string=f"tags.`{RUN_KEY_TAG}` = '{run_key(DAG, run_id)}'")
    assert parent.data.tags["taxiway.sweep"] == "parent" and parent.info.status == "FINISHED"
    children = c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    by_member = {r.data.tags["taxiway.sweep"]: r for r in children}
    assert {m: r.info.status for m, r in by_member.items()} == {"00": "FINISHED", "01": "FINISHED", "02": "FAILED"}
    for member, point in (("00", sweep[0]), ("01", sweep[1])):
        run = by_member[member]
        assert all(run.data.params[k] == str(v) for k, v in point.items()), run.data.params
        assert run.data.metrics["eval.candidate.bits_per_byte"] == pytest.approx(bpb[member])

    (version,) = c.search_model_versions(f"name = '{MODEL}'")  # only the best is a model version
    reg = json.loads(folder.registry_record.read_text())
    assert version.run_id == by_member[ranking["best"]].info.run_id and str(version.version) == reg["version"]
    assert reg["sweep_member"] == ranking["best"] and reg["parent_run_id"] == parent.info.run_id
    assert version.tags["airflow.dag_id"] == DAG and version.tags["airflow.run_id"] == run_id
    passed = rows[0]["gate_passed"]
    assert reg["alias"] == ("champion" if passed else "challenger")
    if passed:
        assert str(c.get_model_version_by_alias(MODEL, "champion").version) == reg["version"]
    else:
        with pytest.raises(MlflowException, match="alias"):
            c.get_model_version_by_alias(MODEL, "champion")

    files = run_files.read(folder.root)  # the runs view's row: the best member's gate, a link to the ranking
    assert files.ranking["best"] == ranking["best"] and files.decision == ("passed" if passed else "failed")
    links = render.run_links(render.RunRow(DAG, run_id, "success", None, None, files), "")
    assert "/go/sweep-ranking/taxiway_sweep/" in links and f"v{reg['version']}" in links

    # a retried register task: the same runs and version, none added
    again = registration.register(folder.root, run_key(DAG, run_id), {"dag_id": DAG, "run_id": run_id})
    assert (again["version"], again["parent_run_id"]) == (reg["version"], reg["parent_run_id"])
    assert len(c.search_model_versions(f"name = '{MODEL}'")) == 1
    assert len(c.search_runs([exp.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")) == 3
    print(f"sweep {run_id}: gangs {a0 - a0:.0f}-{a1 - a0:.0f} s and {b0 - a0:.0f}-{b1 - a0:.0f} s; best member "
          f"{ranking['best']} registered as version {reg['version']}")


@pytest.mark.live
def test_a_sweeps_points_are_a_triggers_values_refused_before_any_run(live_airflow):
    """Sweep points over REST are a trigger's, checked by the one intake at the door: a key only the
    deployment sets (with a ``${VAR}`` value) and a grid of millions of points are answered 400 naming
    point and key, no run is made, and the answer holds nothing of the environment. (A run made by a
    route no guard sees meets the same check in its first task: tests/test_trust.py, tests/test_sweep.py.)"""
    from live_airflow import PLANTED_SECRET

    live = live_airflow
    live.wait_dag(DAG)
    runs = live.api.get(f"/api/v2/dags/{DAG}/dagRuns").json()["total_entries"]
    cases = {
        "owned": ([{"compute.kubernetes.env": {"A": "${SECRET_DB_URL}"}}, {"train.lr": 0.01}],
                  "sweep[0].compute.kubernetes.env: only the deployment sets this"),
        "huge": ({f"train.k{i}": list(range(15)) for i in range(6)}, "11,390,625 member(s); a sweep has 2 to 16"),
    }
    for name, (spec, named) in cases.items():
        resp = live.trigger(DAG, {"sweep": spec})
        assert resp.status_code == 400 and named in resp.text, (name, resp.text)
        assert PLANTED_SECRET not in resp.text, name
    assert live.api.get(f"/api/v2/dags/{DAG}/dagRuns").json()["total_entries"] == runs
