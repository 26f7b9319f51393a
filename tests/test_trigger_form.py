"""The trigger form as the api-server serves it (``GET /api/v2/dags/{id}/details`` dumps the serialized
DAG's params exactly so): fields people change one by one, titled, grouped, with descriptions, enums and
bounds; nothing falsely required; a conf from the form and a nested REST conf make the same run config;
contradictions refused naming both keys; every DAG and task group documented."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from conftest import REPO


@pytest.fixture(scope="module")
def served() -> dict[str, Any]:
    """dag_id → the DAG deserialized from its serialized form, as the api-server and scheduler hold it."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.serialization.serialized_objects import DagSerialization

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return {dag_id: DagSerialization.from_dict(DagSerialization.to_dict(dag)) for dag_id, dag in bag.dags.items()}


def _spec(params) -> dict[str, dict[str, Any]]:
    """What the REST API's DAG details answer holds under ``params`` (DAGDetailsResponse.get_params)."""
    return json.loads(json.dumps({k: v.dump() for k, v in params.items()}))


def _required(spec: dict[str, Any]) -> bool:
    """The Airflow UI's rule (FlexibleForm/isParamRequired): a type, and "null" not among its types."""
    kind = spec["schema"].get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def _descriptions(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [v for k, v in node.items() if k in ("description", "description_md") and isinstance(v, str)] + [
            d for v in node.values() for d in _descriptions(v)]
    if isinstance(node, list):
        return [d for v in node for d in _descriptions(v)]
    return []


def test_served_form_has_titled_grouped_fields_with_enums_and_bounds(served):
    from pipelines.config import SECTIONS
    from taxiway_airflow.form_fields import ADVANCED, GROUPS

    spec = _spec(served["taxiway_train"].params)
    lr = spec["train_lr"]
    assert lr["value"] == 0.005 and lr["schema"]["title"] == "Learning rate (peak)"  # tiny.yaml's lr, validated
    assert lr["schema"]["section"] == "Training" and lr["schema"]["exclusiveMinimum"] == 0
    assert "learning rate" in lr["description"].lower() and "[train.lr]" in lr["description"]
    assert spec["train_steps"]["schema"].items() >= {"type": "integer", "minimum": 1}.items() and spec["train_steps"]["value"] == 30
    assert spec["train_decay"]["schema"]["enum"] == ["cosine", "linear"]
    assert spec["train_parallel"]["schema"]["values_display"]["fsdp"].startswith("FSDP2")
    from pipelines.config.trust import owner_reason  # the gate's set and what keeps it clean are the deployment's
    assert not [k for k, f in ((f.key, f) for fs in GROUPS.values() for f in fs) if owner_reason(f.path)]
    assert not {"data_val", "preflight_action", "preflight_max_overlap_fraction"} & set(spec)
    assert spec["train_steps"]["schema"]["maximum"] == 10_000_000  # every size has a ceiling
    assert spec["tokenizer_vocab_size"]["schema"].items() >= {"minimum": 260, "maximum": 1_048_576}.items()
    assert spec["model_dropout"]["schema"].items() >= {"minimum": 0.0, "maximum": 1.0}.items()
    assert {"compute_nodes", "train_seed", "train_batch_size", "model_n_layer"} <= set(spec)

    # the run-level fields first (the form's open default section), then the groups in order, then the JSON
    sections = [s["schema"].get("section") for s in spec.values()]
    assert sections[:5] == [None] * 5 and list(spec)[:5] == ["config", "name", "parent", "pretrained", "set"]
    assert list(dict.fromkeys(sections[5:])) == [*GROUPS, ADVANCED]
    for name in ("data", "train", "compute", "eval", "registry"):
        assert spec[name]["schema"]["section"] == ADVANCED and isinstance(spec[name]["value"], dict), name
    assert "lr" not in spec["train"]["value"] and "grad_clip" in spec["train"]["value"]  # shown once, not twice

    for key, s in spec.items():
        assert s["schema"].get("title") and s["description"], key
        assert not re.search(r"[a-z]Config\b", s["schema"]["title"]), (key, s["schema"]["title"])  # no class names
        if s["value"] is None:
            assert "null" in s["schema"]["type"], key  # a null value is the default, not a failed validation
    assert not [d for d in _descriptions(spec) if "``" in d]
    optional = {k for k, s in spec.items() if not _required(s)}
    assert {"set", "parent", *(s for s in SECTIONS if s not in ("name", "parent", "refresh", "limits", "alerts"))} <= optional
    assert not [k for k, s in spec.items() if _required(s) and s["value"] in (None, "", [])]  # no required field empty

    assert _spec(served["taxiway_refresh"].params) == spec  # a refresh's own knobs are the deployment's


def test_the_form_offers_no_field_only_the_deployment_sets(served):
    """Neither as a field of its own nor inside a section's JSON (docs/security.md)."""
    from pipelines.config.trust import OWNED, owner_reason

    for dag_id in ("taxiway_train", "taxiway_refresh", "taxiway_sweep"):
        spec = _spec(served[dag_id].params)
        assert not {"refresh", "limits", "alerts"} & set(spec), dag_id
        offered = [k.replace("_", ".", 1) for k in spec if "_" in k and k.split("_", 1)[0] in OWNED.keys() | {
            "eval", "registry", "compute"}]
        offered += [f"{name}.{k}" for name, s in spec.items() if isinstance(s["value"], dict) for k in s["value"]]
        assert not [p for p in offered if owner_reason(p)], dag_id


def _resolved(conf: dict[str, Any]):
    """The run config the first task makes of ``conf`` (its real code path: checks, roots, merge, validation)."""
    from taxiway_airflow.tasks.common import conf_config

    return conf_config(conf)


def _accepted(dag, conf: dict[str, Any]) -> None:
    """Airflow's own check of a trigger's conf against the params (what answers HTTP 400)."""
    dag.params.deep_merge(conf).validate()


def test_form_conf_and_nested_rest_conf_make_the_same_run_config(served):
    dag = served["taxiway_train"]
    form = {k: v["value"] for k, v in _spec(dag.params).items()}  # what the UI sends: every field, defaults included
    form.update(train_lr=0.01, model_n_layer=3, compute_nodes=1)
    form["train"] = {**form["train"], "grad_clip": 0.5}  # a field only the section's JSON shows
    form["eval"] = {**form["eval"], "temperature": 0.5}
    rest = {"train": {"lr": 0.01, "grad_clip": 0.5}, "model": {"n_layer": 3}, "eval": {"temperature": 0.5},
            "compute": {"nodes": 1}}
    for conf in (form, rest):
        _accepted(dag, conf)
    by_form, by_rest = _resolved(form), _resolved(rest)
    assert by_form == by_rest and by_form.sha256() == by_rest.sha256()
    assert (by_form.train.lr, by_form.model.n_layer, by_form.train.grad_clip, by_form.compute.nodes) == (0.01, 3, 0.5, 1)
    assert _resolved({k: v["value"] for k, v in _spec(dag.params).items()}) == _resolved({})  # an untouched form changes nothing
    flat = _resolved({"train_lr": 0.01, "model_n_layer": 3, "compute_nodes": 1, "eval": {"temperature": 0.5},
                      "train": {"grad_clip": 0.5}})  # REST may send form fields too
    assert flat == by_rest


def test_contradictions_are_refused_naming_both_keys_and_a_changed_value_wins(served):
    from pipelines.config import ConfigError
    from taxiway_airflow.params import overrides_from_conf

    with pytest.raises(ConfigError) as err:
        overrides_from_conf({"train_lr": 0.01, "train": {"lr": 0.02}})
    assert "train_lr: contradicts train.lr" in str(err.value) and "send one of them" in str(err.value)
    assert "0.01" not in str(err.value) and "0.02" not in str(err.value)  # names, never a trigger's values
    assert overrides_from_conf({"train_lr": 0.01, "train": {"lr": 0.01}}) == {"train": {"lr": 0.01}}
    default = _spec(served["taxiway_train"].params)["train_lr"]["value"]
    assert overrides_from_conf({"train_lr": default, "train": {"lr": 0.02}}) == {"train": {"lr": 0.02}}
    assert overrides_from_conf({"train_lr": 0.02, "train": {"lr": default}}) == {"train": {"lr": 0.02}}
    assert overrides_from_conf({"train": None, "parent": None}) == {}  # a cleared JSON editor changes nothing


def test_bad_form_values_are_refused_at_trigger_time_naming_the_field(served):
    from airflow.exceptions import ParamValidationError

    from pipelines.config import ConfigError
    from taxiway_airflow.params import check_conf

    dag = served["taxiway_train"]
    for conf, key in [({"train_lr": -1}, "train_lr"), ({"train_decay": "step"}, "train_decay"),
                      ({"compute_nodes": 0}, "compute_nodes"), ({"train": {"stepz": 5}}, "train")]:
        with pytest.raises(ParamValidationError, match=f"param {key}"):
            _accepted(dag, conf)
    with pytest.raises(ConfigError, match=r"train_lrr: not a conf key \(did you mean 'train_lr'\?\)"):
        check_conf({"train_lrr": 0.1})
    with pytest.raises(ConfigError, match="conf: nested 9 levels deep"):
        check_conf({"train": {"a": [[[[[[[[1]]]]]]]]}})
    with pytest.raises(ConfigError, match="conf: larger than 64 KiB"):
        check_conf({"set": ["train.lr=1"] * 10_000})



def test_numbers_msgpack_cannot_carry_are_refused_anywhere_in_a_conf_naming_the_key():
    """A number outside the signed 64-bit range (PostgreSQL's jsonb stores it, a whole float as an
    integer; msgpack, which carries the conf to every task, cannot) or a non-finite one, wherever it
    sits: a section, a list, a form field, a DAG's own key, a ``set`` line's value. The key is named,
    the number never echoed."""
    from pipelines.config import ConfigError
    from taxiway_airflow.params import check_conf

    huge = 2**64
    check_conf({"train": {"seed": 2**63 - 1}, "model_n_layer": -(2**63), "set": ["train.seed=12"]})  # the edges pass
    with pytest.raises(ConfigError) as err:
        check_conf({"train": {"seed": huge}, "compute": {"kubernetes": {"affinity": {"w": [1, -huge - 1]}}},
                    "model_n_layer": 2**63, "train_lr": float("inf"), "parent": float("nan"), "name": 1e30,
                    "set": ["train.seed=18446744073709551616", "train.lr=1e400", "train.steps=3"]}, extra_keys=("x",))
    assert set(err.value.errors) == {"train.seed", "compute.kubernetes.affinity.w[1]", "model_n_layer", "train_lr",
                                     "parent", "name", "set[0] (train.seed)", "set[1] (train.lr)"}
    assert "64-bit" in err.value.errors["train.seed"] and "finite" in err.value.errors["train_lr"]
    assert str(huge) not in str(err.value) and "1844674407" not in str(err.value)
    with pytest.raises(ConfigError, match=r"x\.y: .*64-bit"):
        check_conf({"x": {"y": huge}}, extra_keys=("x",))  # a DAG's own key (taxiway_sweep's sweep) too


def test_every_dag_and_task_group_says_what_it_does_and_where_outputs_go(served):
    for dag_id in ("taxiway_train", "taxiway_refresh", "taxiway_land", "taxiway_sweep"):
        doc = served[dag_id].doc_md
        assert doc and "``" not in doc, dag_id
    train = served["taxiway_train"].doc_md
    assert all(stage in train for stage in ("preflight", "tokenize", "train", "evaluate", "register", "MLflow"))
    wanted = {"preflight": "preflight/report.json", "tokenize": "cache/packed/", "train": "checkpoints/",
              "evaluate": "eval/report.md", "register": "registry.json"}
    for dag_id in ("taxiway_train", "taxiway_refresh"):
        groups = served[dag_id].task_group.children
        for group, where in wanted.items():
            assert where in (groups[group].doc_md or ""), (dag_id, group)
            assert groups[group].tooltip, (dag_id, group)
    sweep = served["taxiway_sweep"].task_group.children
    for group, where in {"preflight": "preflight/report.json", "tokenize": "cache/packed/", "sweep": "ranking.json",
                         "register": "registry.json"}.items():
        assert where in (sweep[group].doc_md or "") and sweep[group].tooltip, group
    member = sweep["sweep"].children["sweep.member"]
    assert "eval/report.json" in (member.doc_md or "") and member.tooltip


# keywords that draft 7 does not know (it would ignore them, so a schema using one validates less)
_NEWER_THAN_DRAFT7 = {"prefixItems", "$defs", "dependentRequired", "dependentSchemas", "unevaluatedItems",
                      "unevaluatedProperties", "$dynamicRef", "$dynamicAnchor", "$anchor", "minContains",
                      "maxContains", "contentSchema", "$vocabulary"}


def _keywords(node: Any) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in _keywords(v)}
    if isinstance(node, list):
        return {k for v in node for k in _keywords(v)}
    return set()


def test_every_param_is_checked_as_draft_7_which_knows_all_its_keywords(served):
    """Airflow checks a Param's schema against its dialect's metaschema on every resolve, and DAG
    serialization resolves each param of each task: draft 7's check is 4x cheaper than the default
    2020-12 (bench/dag_parse_bench.py), and loses nothing only while no schema uses a newer keyword."""
    import jsonschema

    for dag_id, dag in served.items():
        for holder, params in [(dag_id, dag.params), *((t.task_id, t.params) for t in dag.tasks)]:
            for key, spec in _spec(params).items():
                schema = spec["schema"]
                assert jsonschema.validators.validator_for(schema) is jsonschema.Draft7Validator, (holder, key)
                jsonschema.Draft7Validator.check_schema(schema)
                assert not _keywords(schema) & _NEWER_THAN_DRAFT7, (holder, key, _keywords(schema) & _NEWER_THAN_DRAFT7)


def test_land_params_are_bounded_at_trigger_time(served):
    from airflow.sdk.exceptions import ParamValidationError

    land = served["taxiway_land"]
    _accepted(land, {"source": "/data/batch", "batch_id": "b-1"})
    for conf, key in [({"source": "x" * 5000}, "source"), ({"source": "/d", "batch_id": "../x"}, "batch_id"),
                      ({"source": "/d", "batch_id": "b" * 129}, "batch_id")]:
        with pytest.raises(ParamValidationError, match=f"param {key}"):
            _accepted(land, conf)
