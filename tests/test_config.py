"""RunConfig: overlays, overrides, env expansion, schema, and errors naming dotted fields."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from conftest import REPO, TINY
from pipelines.config import ConfigError, RunConfig, load_config
from taxiway_airflow.params import section_schemas


def test_tiny_extends_demo_extends_base():
    cfg = load_config(TINY)
    assert cfg.name == "taxiway-tiny"
    assert cfg.model.n_embd == 32                      # tiny
    assert cfg.registry.model_name == "taxiway-tiny-gpt"
    assert cfg.preflight.overlap_jaccard == 0.8        # base
    assert cfg.data.train.endswith("/demo-data/train")  # demo, ${TAXIWAY_HOME} expanded
    assert Path(cfg.data.train).is_absolute()


def test_set_overrides_parse_yaml_scalars():
    cfg = load_config(TINY, ["train.lr=3e-4", "train.deterministic=true", "compute.nodes=3", "parent=models:/m/1"])
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.train.deterministic is True
    assert cfg.compute.nodes == 3
    assert cfg.parent == "models:/m/1"


def test_every_bad_field_is_named_by_dotted_path():
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["train.lr=-1", "model.n_layer=0", "pack.nonsense=1"])
    assert set(err.value.errors) == {"train.lr", "model.n_layer", "pack.nonsense"}
    assert "greater than 0" in err.value.errors["train.lr"]
    assert "train.lr" in str(err.value)


def test_a_bad_refresh_cron_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"refresh.cron: Value error, not a cron expression"):
        load_config(TINY, ["refresh.cron=every day"])
    assert load_config(TINY, ["refresh.cron=0 */6 * * *"]).refresh.cron == "0 */6 * * *"


def test_cross_field_rules(tmp_path: Path):
    with pytest.raises(ConfigError, match="seq_len"):
        load_config(TINY, ["pack.seq_len=4096"])
    with pytest.raises(ConfigError, match="multiple of n_head"):
        load_config(TINY, ["model.n_embd=30", "model.n_head=4"])


def test_data_paths_are_required(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"extends: {REPO / 'configs' / 'base.yaml'}\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert err.value.errors["data"] == "Field required"


def test_missing_env_var_and_bad_files(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    bad = tmp_path / "env.yaml"
    bad.write_text(f"extends: {TINY}\ndata: {{train: '${{NO_SUCH_VAR}}'}}\n")
    with pytest.raises(ConfigError, match="NO_SUCH_VAR"):
        load_config(bad)
    loop = tmp_path / "loop.yaml"
    loop.write_text("extends: loop.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(loop)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(broken)


def test_frozen_and_hash_stable():
    a, b = load_config(TINY), load_config(TINY)
    assert a.sha256() == b.sha256()
    assert load_config(TINY, ["train.steps=31"]).sha256() != a.sha256()
    with pytest.raises(ValidationError, match="frozen"):
        a.train.lr = 1.0  # type: ignore[misc]


def test_schema_sections_are_self_contained():
    schema = RunConfig.model_json_schema()
    assert set(schema["properties"]) == {
        "name", "data", "preflight", "tokenizer", "pack", "model", "train", "checkpoint",
        "compute", "eval", "registry", "refresh", "limits", "alerts", "parent", "pretrained"}
    sections = section_schemas()
    assert "$ref" not in str(sections)
    assert sections["train"]["properties"]["lr"]["exclusiveMinimum"] == 0.0
    assert sections["train"]["additionalProperties"] is False


def test_architecture_page_lists_every_config_section():
    """docs/architecture.md's RunConfig contract names the sections in the schema's order: a section
    added to the schema and not to the page (as `refresh` once was) fails here."""
    import re

    page = (REPO / "docs" / "architecture.md").read_text()
    listed = re.search(r"Sections `([^`]+)`", page)
    assert listed, "docs/architecture.md: no 'Sections `...`' line in the RunConfig contract"
    assert [s.strip() for s in listed.group(1).split(",")] == list(RunConfig.model_fields)


def _kinds(prop: dict) -> set:
    """What a JSON-schema property holds, bounds and descriptions aside: its types, an enum's values."""
    return {("enum", *map(str, v["enum"])) if "enum" in v else v.get("type") for v in prop.get("anyOf", [prop])}


def test_the_hand_lists_that_follow_the_schema_agree_with_it():
    """A config field is declared once, in the schema; the lists that cannot be derived from it say the
    same: the trainer's typed spec (the trainer image has neither pydantic nor the config package, so
    ``trainer.spec`` lists the train, checkpoint and model fields itself), the trigger form's chosen
    fields and section titles, and the fields only the deployment sets. Each disagreement is named."""
    import dataclasses
    import typing

    from pydantic import TypeAdapter

    from pipelines.config import SECTIONS
    from pipelines.config.trust import OWNED, owner_reason
    from taxiway_airflow.form_fields import ALL_FIELDS, SECTION_TITLES
    from trainer.llama import LlamaConfig
    from trainer.spec import CheckpointSettings, TrainSettings

    schemas = section_schemas()
    problems = []
    # model: the vocabulary comes from the tokenizer, ``arch`` picks the class (trainer/arch.py), and the
    # unset key/value heads and SwiGLU width are resolved (ModelConfig.trainer_fields)
    for cls, section, own, resolved in ((TrainSettings, "train", (), ()), (CheckpointSettings, "checkpoint", (), ()),
                                        (LlamaConfig, "model", ("vocab_size",), ("n_kv_head", "intermediate_size"))):
        hints = typing.get_type_hints(cls)
        props = {k: v for k, v in schemas[section]["properties"].items() if not (section == "model" and k == "arch")}
        theirs = {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in own}
        where = f"{cls.__module__}.{cls.__name__}"
        problems += [f"{section}.{n}: in the schema, missing from {where}" for n in props if n not in theirs]
        problems += [f"{section}.{n}: in {where}, not in the schema" for n in theirs if n not in props]
        problems += [f"{section}.{n}: {where} types it {theirs[n]}, the schema {sorted(map(str, _kinds(props[n])))}"
                     for n in props.keys() & theirs.keys() - set(resolved)
                     if _kinds(props[n]) != _kinds(TypeAdapter(theirs[n]).json_schema())]
    for f in ALL_FIELDS:
        prop = schemas.get(f.section, {}).get("properties", {}).get(f.leaf)
        if prop is None:
            problems.append(f"{f.path}: a trigger-form field (form_fields.GROUPS), not in the schema")
            continue
        enum = {str(v) for k in _kinds(prop) if isinstance(k, tuple) for v in k[1:]}
        if extra := sorted(set(f.values_display) - enum):
            problems.append(f"{f.path}: the form labels values {extra} the schema's enum does not have")
        if owner_reason(f.path):
            problems.append(f"{f.path}: a trigger-form field that only the deployment may set")
    problems += [f"{s}: a config section without a title in form_fields.SECTION_TITLES"
                 for s in SECTIONS if s not in SECTION_TITLES]
    problems += [f"{s}: titled in form_fields.SECTION_TITLES, not a config section"
                 for s in SECTION_TITLES if s not in SECTIONS]
    for path in OWNED:
        section, _, leaf = path.partition(".")
        if section not in SECTIONS or (leaf and leaf not in schemas[section].get("properties", {})):
            problems.append(f"{path}: owned by the deployment (pipelines.config.trust.OWNED), not in the schema")
    assert not problems, "\n".join(problems)
