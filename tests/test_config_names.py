"""The trigger form names config files as a trigger may: relative to the repo or a config root, never by
this machine's folders (the form is shown to every user, and in the docs' screenshots)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, TINY
from pipelines.roots import Roots


def test_a_config_is_named_by_the_shortest_way_back_to_it_from_the_roots(tmp_path: Path):
    deployment = tmp_path / "deployment"
    (deployment / "sub").mkdir(parents=True)
    for name in ("own.yaml", "sub/nested.yaml", "demo.yaml"):  # demo.yaml: the repo's configs/ has one too
        (deployment / name).write_text("name: x\n")
    roots = Roots((REPO / "configs", deployment.resolve()), ())
    assert roots.config_name(TINY) == "configs/tiny.yaml"
    assert roots.config_name(deployment / "own.yaml") == "own.yaml"
    assert roots.config_name(deployment / "sub" / "nested.yaml") == "sub/nested.yaml"
    # "demo.yaml" would lead to the repo's configs/demo.yaml, so only the full path names this one
    assert roots.config_name(deployment / "demo.yaml") == str((deployment / "demo.yaml").resolve())
    for path in (TINY, deployment / "own.yaml", deployment / "sub" / "nested.yaml", deployment / "demo.yaml"):
        assert roots.config_file(roots.config_name(path)) == path.resolve()


def test_the_forms_config_default_holds_no_absolute_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from taxiway_airflow.params import build_params

    assert build_params()["config"].value == "configs/tiny.yaml"  # the test session's TAXIWAY_CONFIG
    own = tmp_path / "deployment" / "own.yaml"
    own.parent.mkdir()
    own.write_text(f"extends: {TINY}\nname: own\n")
    monkeypatch.setenv("TAXIWAY_CONFIG", str(own))
    params = build_params()
    assert params["config"].value == "own.yaml"
    assert not [e for e in params["config"].schema["examples"] if Path(e).is_absolute()]
