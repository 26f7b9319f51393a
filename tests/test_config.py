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
        "compute", "eval", "registry", "refresh", "limits", "parent"}
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
