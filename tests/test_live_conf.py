"""What a user meets when triggering ``taxiway_train`` over REST on a live Airflow: conf mistakes, owned
fields and out-of-bounds configs are refused at the door (400, one readable line, no run), data outside
the data roots by the first task, never echoing a file;
the README's REST example works verbatim. (A transient failure retried by the scheduler: the good run
of tests/test_live_ui.py. Runs on a machine loaded past its cores, every task on its first try:
bench/celery_load.py's ``retried``.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from live_airflow import PLANTED_SECRET, wait_for

from conftest import REPO

DAG = "taxiway_train"
SECRET = "s3cr3t-hash-do-not-echo"


def _log(live, run_id: str, task_id: str, attempt: int = 1) -> str:
    log = live.task_log(DAG, run_id, task_id, attempt)
    assert log is not None, f"no log for {task_id} of {run_id}"
    return log


@pytest.mark.live
def test_trigger_time_refusals_are_short_and_name_the_field(live_airflow):
    params = live_airflow.api.get(f"/api/v2/dags/{DAG}/details").json()["params"]  # what the trigger form renders
    assert params["train_lr"]["schema"]["section"] == "Training" and params["train_lr"]["value"] == 0.005
    assert params["set"]["schema"]["type"] == ["array", "null"]  # optional: the form marks it not required
    for conf, field in [({"train": {"stepz": 5}}, "stepz"), ({"train": {"lr": -1}}, "lr"),
                        ({"train_lr": -1}, "train.lr"),  # the field the form field sets
                        ({"config": "/etc/shadow"}, "config")]:
        resp = live_airflow.trigger(DAG, conf)
        assert resp.status_code == 400, (conf, resp.status_code, resp.text)
        detail = resp.json()["detail"]
        assert field in detail and len(detail) < 1200, (conf, len(detail), detail)


@pytest.mark.live
def test_conf_mistakes_are_refused_at_the_door_naming_the_key_and_echo_no_file(live_airflow, tmp_path: Path):
    live = live_airflow
    evil = tmp_path / "evil.yaml"  # a readable YAML on the worker that is no config: never echoed
    evil.write_text(f"root:{SECRET}:19000:0:99999:7:::\nname: x\n")
    linked = tmp_path / "linked.yaml"
    linked.write_text(f"extends: {evil}\nname: y\n")
    escape = "configs/" + os.path.relpath(evil, REPO / "configs")
    loose = live.config_root / "loose.yaml"  # in a config root, but not one the deployment lists
    loose.write_text(f"extends: {REPO / 'configs' / 'tiny.yaml'}\nregistry:\n  approval: auto\n")
    cases = {
        "typo": ({"trian": {"lr": 0.1}}, "trian: not a conf key (did you mean 'train'?)"),
        "missing": ({"config": "configs/missing.yaml"}, "no such file in the config roots"),
        "outside": ({"config": str(evil)}, "outside the config roots"),
        "dotdot": ({"config": escape}, "outside the config roots"),
        "extends": ({"config": str(linked)}, "outside the config roots"),
        "data": ({"data": {"train": "/etc"}}, "data.train: '/etc' is outside the data roots"),
        "contradiction": ({"train_lr": 0.01, "train": {"lr": 0.02}}, "train_lr: contradicts train.lr"),
        # the trust boundary's attacks (docs/security.md), each refused before any stage runs
        "cluster": ({"compute": {"kubernetes": {"image": "attacker.example/x:v1", "service_account": "taxiway-launcher",
                                                "secret_env_from": ["taxiway-airflow-metadata"]}}},
                    "compute.kubernetes.image: only the deployment sets this"),
        "gate": ({"registry": {"challenger_alias": "champion"}, "eval": {"confidence": 0.5}},
                 "registry.challenger_alias: only the deployment sets this"),
        "escaped env": ({"set": ['compute.kubernetes.labels={a: "\\x24{SECRET_DB_URL}"}']},
                        "compute.kubernetes.labels: Value error, a: label value must be"),
        "anchors": ({"set": ["model={a: &x [1], b: *x}"]}, "model: YAML anchors and aliases"),
        "limits": ({"limits": {"nodes": 1000}}, "limits.nodes: only the deployment sets this"),
        "chosen config": ({"config": "loose.yaml"}, "not a config this deployment lets a trigger choose"),
        "gate's set": ({"data": {"val": str(live.taxiway_home / "demo-data" / "train")},
                        "preflight": {"max_overlap_fraction": 1.0}}, "data.val: only the deployment sets this"),
    }
    # a number no task could receive (msgpack stops at 64 bits): refused by the api-server, no run made
    before = live.api.get(f"/api/v2/dags/{DAG}/dagRuns").json()["total_entries"]
    resp = live.trigger(DAG, {"trian": 2**64 + 7})
    assert resp.status_code == 400 and "trian: a number outside the signed 64-bit range" in resp.text, resp.text
    assert str(2**64 + 7) not in resp.text
    assert live.api.get(f"/api/v2/dags/{DAG}/dagRuns").json()["total_entries"] == before
    tom = live.client("tom")  # the ``user`` role: may trigger, not configure the deployment
    data = cases.pop("data")  # the api-server reads no data: the first task judges the data roots
    for name, (conf, named) in cases.items():  # refused at the door, as the first task would: no run
        resp = tom.post(f"/api/v2/dags/{DAG}/dagRuns", json={"logical_date": None, "conf": conf})
        assert resp.status_code == 400, (name, resp.status_code, resp.text)
        detail = resp.json()["detail"]
        assert named in detail and SECRET not in detail and PLANTED_SECRET not in detail, (name, detail)
    resp = tom.post(f"/api/v2/dags/{DAG}/dagRuns", json={"logical_date": None, "conf": data[0]})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    assert live.wait_run(DAG, run_id, timeout_s=300)["state"] == "failed"
    tis = live.task_instances(DAG, run_id)
    assert tis["resolve_config"]["state"] == "failed" and tis["resolve_config"]["try_number"] == 1
    assert {ti["state"] for k, ti in tis.items() if k != "resolve_config"} == {"upstream_failed"}
    log = _log(live, run_id, "resolve_config")
    assert data[1] in log and SECRET not in log and live.env["AIRFLOW__API_AUTH__JWT_SECRET"] not in log
    assert not live.files_holding(PLANTED_SECRET)  # no file the deployment wrote holds its environment's secret
    # the failure's note, set over REST by the task's callback within its budget (or by the DAG's after it)
    note = wait_for("the failed run's note", lambda: live.dag_run(DAG, run_id)["note"], 60)
    assert note.startswith("**Failed at resolve_config** (`resolve_config`, bad input): data.train: "), note


@pytest.mark.live
def test_form_fields_and_sections_sent_together_make_one_config(live_airflow):
    """A conf as the trigger form sends it (form fields, a section's other fields) gets past Airflow and
    ``resolve_config`` into the run's config.yaml; the run is then stopped."""
    import yaml

    from pipelines.run_folder import run_dir

    live = live_airflow
    resp = live.trigger(DAG, {"train_steps": 7, "model_n_layer": 1, "train": {"grad_clip": 0.5}})
    assert resp.status_code == 200, resp.text
    run_id = resp.json()["dag_run_id"]
    wait_for("resolve_config to finish", lambda: live.task_instances(DAG, run_id).get("resolve_config", {})
             .get("state") in ("success", "failed"), 120, every_s=1)
    live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{run_id}", json={"state": "failed"}).raise_for_status()
    assert live.task_instance(DAG, run_id, "resolve_config")["state"] == "success", _log(live, run_id, "resolve_config")
    cfg = yaml.safe_load((run_dir(DAG, run_id, live.taxiway_home) / "config.yaml").read_text())
    assert (cfg["train"]["steps"], cfg["model"]["n_layer"], cfg["train"]["grad_clip"]) == (7, 1, 0.5)


def _readme_rest_example() -> str:
    text = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    example = [b for b in blocks if "/api/v2/dags/taxiway_train/dagRuns" in b]
    assert len(example) == 1, "the README should hold one REST example"
    return example[0]


@pytest.mark.live
def test_readme_rest_example_works_verbatim_on_a_paused_dag(live_airflow):
    """A fresh install's DAG is paused (a run created then stays queued for ever); the README's
    commands unpause it, and the run they create gets going (its first task succeeds)."""
    live = live_airflow
    live.api.patch(f"/api/v2/dags/{DAG}", json={"is_paused": True}).raise_for_status()
    before = {r["dag_run_id"] for r in live.api.get(f"/api/v2/dags/{DAG}/dagRuns", params={"limit": 200}).json()["dag_runs"]}
    env = {**os.environ, "AIRFLOW_URL": live.url, "AIRFLOW_PASSWORD": live.password,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", _readme_rest_example()], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    after = live.api.get(f"/api/v2/dags/{DAG}/dagRuns", params={"limit": 200}).json()["dag_runs"]
    new = [r["dag_run_id"] for r in after if r["dag_run_id"] not in before]
    assert len(new) == 1, out.stdout
    wait_for("the README's run to start", lambda: live.task_instances(DAG, new[0]).get("resolve_config", {})
             .get("state") == "success", 120, every_s=1)
    live.api.patch(f"/api/v2/dags/{DAG}/dagRuns/{new[0]}", json={"state": "failed"}).raise_for_status()
