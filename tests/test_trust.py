"""The trust boundary (docs/security.md): what a trigger may set, and what only the deployment may.

Every attack here is one a person with only the right to trigger a DAG could send; each goes through
the first task's real code path (``conf_config``: roots, conf checks, the file chain, the overlay, the
RunConfig) or the sweep's (``points.members``). The live REST path is in tests/test_live_conf.py.
"""

from __future__ import annotations

import tracemalloc

import pytest

from conftest import TINY, deployment_config
from pipelines.config import ConfigError, load_config
from pipelines.errors import BadInput

SECRET = "postgresql://airflow:S3cr3tPw@db/airflow"


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> str:
    """A credential in the worker's environment, as a deployment's would be."""
    monkeypatch.setenv("SECRET_DB_URL", SECRET)
    return SECRET


def _config(conf: dict):
    from taxiway_airflow.tasks.common import conf_config

    return conf_config(conf)


def _refused(conf: dict) -> str:
    with pytest.raises(ConfigError) as err:
        _config(conf)
    text = str(err.value)
    assert SECRET not in text and "S3cr3t" not in text
    return text


def test_a_trigger_cannot_choose_the_cluster_image_secrets_account_or_launcher(demo_data):
    kube = {"require_digest": False, "image": "attacker.example/x:v1", "service_account": "taxiway-launcher",
            "secret_env_from": ["taxiway-airflow-metadata"], "connection_id": "some_other_cluster",
            "volume_claim": "someone-elses", "namespace": "kube-system"}
    text = _refused({"compute": {"kubernetes": kube, "launcher": "kubernetes"}})
    for key in [*kube.keys() - {"require_digest"}, "launcher"]:  # require_digest: false is the default: no change
        prefix = "compute." if key == "launcher" else "compute.kubernetes."
        assert f"{prefix}{key}: only the deployment sets this" in text, (key, text)
    assert "attacker.example" not in text and "taxiway-airflow-metadata" not in text  # names, never values
    text = _refused({"set": ["compute.kubernetes.image=attacker.example/x:v1", "compute={launcher: local}"]})
    assert "compute.kubernetes.image: only the deployment sets this" in text
    assert "compute: only the deployment sets this (it replaces compute.launcher" in text  # a whole section too


def test_values_a_trigger_sends_are_never_read_from_the_environment(planted, demo_data, tmp_path, monkeypatch):
    """Even where the deployment lets its users set a field, ``${VAR}`` in a trigger's value is text:
    in a conf, behind a YAML escape in ``set``, and in a sweep point."""
    from pipelines.sweep import points

    allow = deployment_config(tmp_path, monkeypatch, "limits:\n  trigger_may_set: [compute.kubernetes.labels, "
                                               "compute.kubernetes.env]\n")
    for conf in ({"set": ['compute.kubernetes.labels={a: "\\x24{SECRET_DB_URL}"}']},
                 {"compute": {"kubernetes": {"labels": {"a": "${SECRET_DB_URL}"}}}}):
        text = _refused({"config": allow, **conf})
        assert "compute.kubernetes.labels: Value error, a: label value must be" in text, text
    cfg = _config({"config": allow, "compute": {"kubernetes": {"env": {"NCCL_SOCKET_IFNAME": "${SECRET_DB_URL}"}}}})
    assert cfg.compute.kubernetes.env == {"NCCL_SOCKET_IFNAME": "${SECRET_DB_URL}"}
    assert SECRET not in cfg.to_yaml()
    with pytest.raises(ConfigError) as err:
        points.members(cfg, [{"compute.kubernetes.labels": {"a": "${SECRET_DB_URL}"}}, {"train.lr": 0.01}])
    assert "sweep[0].compute.kubernetes.labels" in str(err.value) and SECRET not in str(err.value)
    monkeypatch.setenv("TAXIWAY_CONFIG", str(TINY))  # a deployment that allows nothing
    with pytest.raises(ConfigError, match=r"sweep\[0\].compute.kubernetes.labels: only the deployment"):
        points.members(_config({}), [{"compute.kubernetes.labels": {"a": "x"}}, {"train.lr": 0.01}])


def test_only_the_gate_moves_champion_and_a_trigger_cannot_weaken_it(demo_data, tmp_path, monkeypatch):
    text = _refused({"registry": {"challenger_alias": "champion", "model_name": "other"},
                     "eval": {"confidence": 0.5, "max_batches": 1, "bootstrap_samples": 100, "baseline": "floor"}})
    for key in ("registry.challenger_alias", "registry.model_name", "eval.confidence", "eval.max_batches",
                "eval.bootstrap_samples", "eval.baseline"):
        assert f"{key}: only the deployment sets this" in text, (key, text)
    same = deployment_config(tmp_path, monkeypatch, "registry:\n  challenger_alias: Champion\n")
    with pytest.raises(ConfigError, match="champion_alias and challenger_alias must differ"):
        load_config(same)


def test_a_triggered_refresh_cannot_move_the_landing_zone_or_its_policy(demo_data, tmp_path):
    """``refresh.*`` is the deployment's: a conf pointing the landing zone elsewhere (to write invented
    batch ids into the ledger) or loosening the quarantine is refused by the refresh's first task too."""
    text = _refused({"refresh": {"landing": str(tmp_path / "elsewhere"), "max_attempts": 100}})
    assert "refresh.landing: only the deployment sets this" in text and "refresh.max_attempts" in text
    assert str(tmp_path) not in text


def test_limits_bound_a_run_and_a_trigger_cannot_raise_them(demo_data, tmp_path, monkeypatch):
    assert "limits.nodes: only the deployment sets this" in _refused({"limits": {"nodes": 64}, "compute": {"nodes": 20}})
    assert "compute.nodes (17) exceeds limits.nodes (16)" in _refused({"compute": {"nodes": 17}})
    text = _refused({"train": {"steps": 2_000_000, "log_every": 1}, "model": {"n_layer": 512, "n_embd": 8192}})
    assert "train.steps (2000000) exceeds limits.steps (1000000)" in text
    assert "over limits.parameters" in text and "over limits.checkpoint_disk_gb" in text
    assert "train.steps / train.log_every is over 1,000,000 lines" in text
    text = _refused({"compute": {"threads_per_proc": 17}, "preflight": {"workers": 64},
                     "tokenizer": {"train_max_bytes": None}})
    assert "compute.threads_per_proc (17) exceeds limits.threads_per_proc (16)" in text
    assert "preflight.workers (64) exceeds limits.preflight_workers (16)" in text
    assert "tokenizer.train_max_bytes (null: every train file) exceeds limits.tokenizer_train_bytes" in text
    from taxiway_airflow.tasks.train import max_mapped  # shard sizes of 1 fan out no wider than this

    assert max_mapped(_config({"set": ["preflight.shard_bytes=1", "pack.shard_bytes=1"]})) == 256
    small = deployment_config(tmp_path, monkeypatch, "limits:\n  sweep_members: 3\n")
    from pipelines.sweep import points

    with pytest.raises(ConfigError, match="4 member"):
        points.members(_config({"config": small}), {"train.lr": [0.1, 0.2], "train.seed": [1, 2]})


def test_a_sweeps_size_is_known_before_any_point_is_built():
    """A 2.7 KB grid names 8 million points: refused from its lists' lengths, in bounded memory."""
    from pipelines.sweep import points

    grid = {f"train.k{i}": list(range(15)) for i in range(6)} | {"train.lr": [0.1] * 2}
    tracemalloc.start()
    with pytest.raises(ConfigError, match=r"22,781,250 member\(s\); a sweep has 2 to 16"):
        points.members(load_config(TINY), grid)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1 << 20, peak


@pytest.mark.parametrize(("line", "why"), [
    ("train.lr=&a 0.1", "anchors and aliases"),
    ("model={a: &x [1, 2], b: *x}", "anchors and aliases"),
    ("name=!!python/object/apply:os.system [id]", "tags"),
    ("train.lr={", "not valid YAML"),
    ("compute.nodes=" + "[" * 9 + "]" * 9, "nested deeper than 8"),
    ("train.lr=" + "1" * 5000, "longer than 4096"),
])
def test_a_set_value_is_plain_bounded_yaml_and_a_bad_one_is_bad_input(demo_data, line, why):
    with pytest.raises(BadInput) as err:
        _config({"set": [line]})
    assert isinstance(err.value, ConfigError) and why in str(err.value), str(err.value)


def test_every_size_count_and_duration_in_the_schema_has_a_ceiling():
    """Walks the RunConfig's JSON schema: numbers have both bounds within 64 bits (a trigger's 2**64 would
    be stored by PostgreSQL's jsonb, then no task of the run could receive its conf over msgpack),
    strings a length, lists and maps a size."""
    from pipelines.config import RunConfig
    from taxiway_airflow.params import _inline_refs

    schema = RunConfig.model_json_schema()
    unbounded: list[str] = []

    def walk(node: dict, where: str) -> None:
        for v in node.get("anyOf") or [node]:
            kind = v.get("type")
            if kind in ("integer", "number"):
                for side, most in (("minimum", -(2**63)), ("maximum", 2**63 - 1)):
                    bound = v.get(side, v.get(f"exclusive{side.title()}"))
                    if bound is None or abs(bound) > abs(most):  # jsonb may keep a whole float as an integer
                        unbounded.append(f"{where}: no {side}" + (" within 64 bits" if bound is not None else ""))
            if kind == "string" and not {"maxLength", "enum", "const"} & set(v):
                unbounded.append(f"{where}: no maxLength")
            if kind == "array":
                unbounded.extend([f"{where}: no maxItems"] if "maxItems" not in v else [])
                walk(v.get("items", {}), f"{where}[]")
            if kind == "object":
                for key, sub in v.get("properties", {}).items():
                    walk(sub, f"{where}.{key}".lstrip("."))
                if "properties" not in v and "maxProperties" not in v:
                    unbounded.append(f"{where}: no maxProperties")
                if isinstance(v.get("additionalProperties"), dict):
                    walk(v["additionalProperties"], f"{where}.*")

    walk(_inline_refs(schema, schema["$defs"]), "")
    assert not unbounded, "\n".join(unbounded)


@pytest.mark.parametrize("shape", [["model.arch=gpt"], [], ["model.n_kv_head=2", "model.tie_embeddings=false",
                                                          "model.intermediate_size=100"]])
def test_the_parameter_estimate_is_the_models_own_count(shape: list[str]):
    from pipelines.config.limits import parameters
    from trainer import arch

    cfg = load_config(TINY, ["model.n_layer=3", "model.n_embd=48", "model.n_head=4", *shape])
    model = arch.build(arch.config_from_dict(cfg.model.trainer_fields(cfg.tokenizer.vocab_size), "config"))
    assert parameters(cfg.model, cfg.tokenizer.vocab_size) == sum(p.numel() for p in model.parameters())


def test_a_deployment_may_allow_an_owned_field_explicitly(demo_data, tmp_path, monkeypatch):
    allow = deployment_config(tmp_path, monkeypatch, "limits:\n  trigger_may_set: [eval.seed]\n")
    assert _config({"config": allow, "eval": {"seed": 7}}).eval.seed == 7
    assert "eval.confidence: only the deployment" in _refused({"config": allow, "eval": {"confidence": 0.9}})


def test_the_security_docs_table_lists_every_field_with_its_owner():
    """docs/security.md's table is the trust model users read: it must name every field of every
    section, each in the column ``pipelines.config.trust`` puts it in."""
    import re

    from pydantic import BaseModel

    from conftest import REPO
    from pipelines.config import SECTIONS, RunConfig
    from pipelines.config.trust import owner_reason

    def leaves(model: type[BaseModel], prefix: str) -> list[str]:
        out = []
        for name, field in model.model_fields.items():
            sub = field.annotation
            out += leaves(sub, f"{prefix}{name}.") if isinstance(sub, type) and issubclass(sub, BaseModel) else [
                f"{prefix}{name}"]
        return out

    from pipelines.config.trust import table

    text = (REPO / "docs" / "security.md").read_text()
    assert table() in text, "docs/security.md's table is generated: python -m pipelines.config.trust"
    rows = {m[1]: (m[2], m[3]) for m in re.finditer(r"^\| `(\w+)` \| (.*?) \| (.*?) \|$", text, re.M)}
    assert list(rows) == list(SECTIONS)
    for section, (trigger, deployment) in rows.items():
        ann = RunConfig.model_fields[section].annotation
        fields = [section] if not (isinstance(ann, type) and issubclass(ann, BaseModel)) else [
            f"{section}.{f}" for f in leaves(ann, "")]
        named = {col: {f"{section}.{n}" if n != section else n for n in re.findall(r"`([\w.*]+)`", cell)}
                 for col, cell in (("trigger", trigger), ("deployment", deployment))}
        for path in fields:
            col = "deployment" if owner_reason(path) else "trigger"
            star = f"{path.rsplit('.', 1)[0]}.*"
            assert path in named[col] or star in named[col], (path, col)


def test_a_run_id_never_reaches_an_mlflow_filter_as_written():
    """A REST caller picks the run id: its MLflow key is the run folder's name (filter-safe, one per
    (DAG, run id)), and a quote that would end a filter's string is refused, never sent."""
    from pipelines.registry.runs import literal
    from pipelines.run_folder import run_key

    keys = {run_key("taxiway_train", "x' and tags.a = 'b"), run_key("taxiway_train", "x_and_tags.a_b"),
            run_key("taxiway_sweep", "x' and tags.a = 'b")}
    assert len(keys) == 3 and all(literal(k, "run key") == f"'{k}'" for k in keys)
    for bad in ("x'y", 'x"y', "x\\y", "x`y"):
        with pytest.raises(BadInput, match="run key: quotes and backslashes"):
            literal(bad, "run key")


def test_a_trigger_names_a_config_only_from_the_deployments_list_and_it_owns_nothing(demo_data, tmp_path, monkeypatch):
    """``{"config": "base.yaml"}`` once replaced the deployment's gate, approval and limits with the repo's
    defaults. Now the repo's configs/ is no config root of a deployment whose config lives elsewhere, a
    file is chosen only from ``limits.trigger_may_choose``, and whatever is chosen, every owned field is
    the deployment's (its other fields are the chosen file's)."""
    from conftest import REPO
    from pipelines.roots import OutOfBounds

    strict = ("registry:\n  approval: required\n  approvers: [ada]\neval:\n  confidence: 0.99\n"
              "limits:\n  steps: 50000\n")
    deployment_config(tmp_path, monkeypatch, strict)
    for name, why in (("base.yaml", "no such file in the config roots"),
                      (str(REPO / "configs" / "base.yaml"), "outside the config roots")):
        with pytest.raises(OutOfBounds, match=why) as err:
            _config({"config": name})
        assert str(REPO / "configs") + "," not in str(err.value)  # no root is listed to a trigger
    monkeypatch.setenv("TAXIWAY_CONFIG_ROOTS", f"{tmp_path}:{REPO / 'configs'}")
    with pytest.raises(OutOfBounds, match="not a config this deployment lets a trigger choose"):
        _config({"config": "demo.yaml"})
    deployment_config(tmp_path, monkeypatch, strict + f"  trigger_may_choose: [{REPO / 'configs' / 'demo.yaml'}]\n")
    monkeypatch.setenv("TAXIWAY_CONFIG_ROOTS", f"{tmp_path}:{REPO / 'configs'}")
    cfg = _config({"config": "demo.yaml"})
    assert (cfg.registry.approval, cfg.registry.approvers, cfg.eval.confidence, cfg.limits.steps) == (
        "required", ["ada"], 0.99, 50000)
    assert (cfg.registry.model_name, cfg.eval.floor, cfg.eval.max_batches) == ("taxiway-tiny-gpt", "uniform", 8)
    assert (cfg.name, cfg.model.n_layer) == ("taxiway-demo", 4)  # the chosen file's own run-level fields


def test_a_task_derives_its_run_folder_and_holds_its_config_to_the_deployments(planted, demo_data, tmp_path, monkeypatch):
    """The ``run`` XCom a task receives once named its folder: a user who may edit XComs pointed every later
    task elsewhere (any config.yaml, any report). Now the folder is the DAG run's, a sweep member only one
    the sweep listed, and a config.yaml whose owned fields differ from the deployment's is refused, naming
    them; a trigger's ``${VAR}`` in it stays text when it is read back."""
    from types import SimpleNamespace

    from airflow.sdk.execution_time.context import set_current_context

    from pipelines import run_folder
    from pipelines.stages.prepare import StageInputError
    from taxiway_airflow.tasks.common import prepared, run_config, run_dir_of

    allow = deployment_config(tmp_path, monkeypatch, "limits:\n  trigger_may_set: [compute.kubernetes.env]\n")
    own = run_folder.run_dir("taxiway_train", "manual__1")
    cfg = _config({"config": allow, "compute": {"kubernetes": {"env": {"X": "${SECRET_DB_URL}"}}}})
    with set_current_context({"dag": SimpleNamespace(dag_id="taxiway_train"), "run_id": "manual__1"}):
        xcom = prepared(cfg, own)
        assert "run_dir" not in xcom
        elsewhere = tmp_path / "elsewhere"
        assert run_dir_of({**xcom, "run_dir": str(elsewhere)}) == own
        with pytest.raises(StageInputError, match="run the sweep's 'members' task first"):
            run_dir_of({"member": "00"})  # no sweep here: no member is listed
        from pipelines.run_folder import RunFolder
        from trainer import fsio

        fsio.write_json(RunFolder(own).sweep_members, [{"member": "00"}, {"member": "01"}])  # as members.write lists them
        assert run_dir_of({"member": "01"}) == RunFolder(own).sweep_member(1)
        for member in ("../../etc", "02", 3, "-1", None):  # a path, an index the sweep did not list, not an index
            with pytest.raises(StageInputError, match="not a member of this sweep"):
                run_dir_of({"member": member})
        assert run_config(own).compute.kubernetes.env == {"X": "${SECRET_DB_URL}"}
        written = own / "config.yaml"
        written.write_text(written.read_text().replace("confidence: 0.95", "confidence: 0.5")
                           .replace("approval: auto", "approval: required"))
        with pytest.raises(ConfigError) as err:
            run_config(own)
        assert "eval.confidence: differs from the deployment's config" in str(err.value)
        assert "registry.approval: differs" in str(err.value) and "0.5" not in str(err.value)


def test_an_approver_role_stands_for_its_users_and_a_role_with_none_is_refused(monkeypatch: pytest.MonkeyPatch):
    """Airflow checks an answer against user ids only: ``role:NAME`` becomes every user holding the role
    (SimpleAuthManager's list), once per user; a role no one holds would leave the approval anyone's,
    and another auth manager keeps its roles where a task cannot read them: both refused, naming the field."""
    from taxiway_airflow.approvers import people

    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin,ada:user,tom:user,op:Op")
    assert people(["bob", "ada", "role:user", "role:op"]) == ["bob", "ada", "tom", "op"]
    assert people([]) == [] and people(["ada"]) == ["ada"]
    with pytest.raises(ConfigError, match=r"registry.approvers: role 'viewer': no user holds it"):
        people(["ada", "role:viewer"])
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER", "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager")
    with pytest.raises(ConfigError, match=r"registry.approvers: role entries .* with FabAuthManager, list user ids"):
        people(["role:admin"])
    assert people(["ada"]) == ["ada"]  # user ids need no roles
