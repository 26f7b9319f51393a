"""The DAG folder parses cleanly, imports nothing heavy, and builds its trigger form from RunConfig."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

HEAVY = ("torch", "mlflow", "great_expectations", "datasketch", "tokenizers", "matplotlib")


def test_dag_folder_has_no_import_errors():
    from airflow.configuration import conf
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    dag = bag.dags.get("taxiway_train")
    assert dag is not None and dag.schedule is None
    # how many runs are active at once is the deployment's [core] max_active_runs_per_dag: runs waiting
    # for approval hold their place, and a cap of the DAG's own queued every later run behind them
    assert dag.max_active_runs == conf.getint("core", "max_active_runs_per_dag")
    groups = [t.task_id.split(".")[0] for t in dag.topological_sort()]
    order = [g for i, g in enumerate(groups) if g not in groups[:i]]
    assert order == ["resolve_config", "preflight", "tokenize", "train", "evaluate", "register"]
    assert {t for t in dag.task_ids if t.startswith("preflight.")} == {"preflight.plan", "preflight.scan", "preflight.gate"}
    scan = dag.get_task("preflight.scan")  # one mapped task instance per shard the plan returns
    assert "preflight.plan" in scan.upstream_task_ids and "preflight.scan" in dag.get_task("preflight.gate").upstream_task_ids
    assert scan.is_mapped
    # tokenize: the tokenizer and the plan, one mapped task per shard, then the reduce that packs
    shard = dag.get_task("tokenize.shard")
    assert shard.upstream_task_ids == {"tokenize.tokenizer", "resolve_config"}
    assert shard.get_needs_expansion() and shard.downstream_task_ids == {"tokenize.pack"}
    # the tokenizer and the shards run beside the gate, queued after it; the pack, and all after it,
    # wait for the gate
    assert dag.get_task("tokenize.tokenizer").upstream_task_ids == {"resolve_config", "preflight.scan"}
    assert dag.get_task("tokenize.pack").upstream_task_ids == {"tokenize.shard", "preflight.gate", "resolve_config"}
    assert "tokenize.shard" not in dag.get_task("preflight.gate").get_flat_relative_ids(upstream=True)


def test_tasks_push_one_xcom_each():
    """A task that returns a dict pushes it as one ``return_value``: Airflow infers ``multiple_outputs``
    from a ``dict`` return annotation and would push every key as an XCom of its own too (a tokenize
    shard: 8 execution-API calls and database writes instead of 1), which no consumer reads."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    spread = sorted(f"{dag_id}:{t.task_id}" for dag_id, dag in bag.dags.items() for t in dag.tasks
                    if getattr(t, "multiple_outputs", False))
    assert spread == []


def test_sweep_dag_maps_members_between_shared_stages_and_ranking():
    """taxiway_sweep: one preflight and one tokenize, then a mapped member group, a ranking that waits
    for every member (and runs when one succeeded), and one registration."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.taskgroup import MappedTaskGroup

    dag = DagBag(dag_folder=str(REPO / "dags")).dags["taxiway_sweep"]
    assert dag.schedule is None and "sweep" in dag.params and "train_lr" in dag.params
    groups = [t.task_id.rsplit(".", 1)[0] if t.task_id.count(".") > 1 else t.task_id.split(".")[0]
              for t in dag.topological_sort()]
    order = [g for i, g in enumerate(groups) if g not in groups[:i]]
    assert order == ["resolve_config", "preflight", "tokenize", "sweep", "sweep.member", "register"]
    member = {t.task_id for t in dag.tasks if t.task_id.startswith("sweep.member.")}
    assert member == {f"sweep.member.{t}" for t in ("smoke", "gang", "final_checkpoint", "score")}
    assert isinstance(dag.task_group_dict["sweep.member"], MappedTaskGroup)
    rank = dag.get_task("sweep.rank")
    assert rank.upstream_task_ids == {"sweep.member.score"} and rank.trigger_rule == "all_done_min_one_success"
    assert dag.get_task("register.model_version").upstream_task_ids >= {"sweep.rank"}


@pytest.mark.parametrize("name", ["taxiway_train", "taxiway_sweep"])
def test_dag_module_imports_nothing_heavy(name: str):
    """In a fresh interpreter, importing the DAG file must not pull torch, mlflow or GE."""
    plugins, dag_file = str(REPO / "plugins"), str(REPO / "dags" / f"{name}.py")
    code = (f"import sys, runpy, json; sys.path.insert(0, {plugins!r}); runpy.run_path({dag_file!r}); "
            f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_params_mirror_config_and_reject_bad_conf():
    from airflow.sdk.definitions.param import ParamsDict
    from airflow.sdk.exceptions import ParamValidationError

    from taxiway_airflow.params import build_params

    params = build_params()
    assert {"config", "set", "train", "model", "data", "parent"} <= set(params)
    assert params["train_steps"].value == 30  # defaults from the default config (tiny in tests)
    good = ParamsDict(params)
    good.update({"train": {"lr": 3e-4}})
    good.validate()
    bad = ParamsDict(params)
    with pytest.raises(ParamValidationError, match="train"):
        bad.update({"train": {"lr": -1}})
        bad.validate()


def test_only_changed_leaves_override_the_config_file():
    from taxiway_airflow.params import default_config_path, form_defaults, overrides_from_conf

    defaults = form_defaults(default_config_path())
    full_form = {**defaults, "train": {**defaults["train"], "lr": 0.01}}
    assert overrides_from_conf(full_form) == {"train": {"lr": 0.01}}
    assert overrides_from_conf({"model": {"n_layer": 3}}) == {"model": {"n_layer": 3}}
    assert overrides_from_conf({}) == {}
