"""Config and data roots for triggered runs, and config errors that never echo a file's contents."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import REPO, TINY, taxiway
from pipelines.config import ConfigError, load_config
from pipelines.roots import OutOfBounds, Roots

SECRET = "s3cr3t-do-not-echo"


@pytest.fixture
def roots(tmp_path: Path) -> Roots:
    (tmp_path / "cfgs").mkdir()
    (tmp_path / "data").mkdir()
    return Roots((REPO / "configs", (tmp_path / "cfgs").resolve()), (str((tmp_path / "data").resolve()), "s3://bucket/corpus"))


def _shadow(path: Path) -> Path:
    path.write_text(f"root:$y$j9T${SECRET}:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    return path


def test_config_names_resolve_inside_the_roots_only(roots: Roots, tmp_path: Path):
    assert roots.config_file("configs/tiny.yaml") == TINY.resolve()
    assert roots.config_file("tiny.yaml") == TINY.resolve()           # relative to a root
    (tmp_path / "cfgs" / "mine.yaml").write_text("extends: " + str(TINY) + "\nname: mine\n")
    assert roots.config_file(str(tmp_path / "cfgs" / "mine.yaml")).name == "mine.yaml"
    outside = _shadow(tmp_path / "shadow.yaml")
    (tmp_path / "cfgs" / "link.yaml").symlink_to(outside)             # a symlink out of a root
    for name, why in [(str(outside), "outside the config roots"),
                      ("configs/" + os.path.relpath(outside, REPO / "configs"), "outside the config roots"),
                      (str(tmp_path / "cfgs" / "link.yaml"), "outside the config roots"),
                      ("configs/nope.yaml", "no such file"), ("/etc/shadow", "not a .yaml/.yml file")]:
        with pytest.raises(OutOfBounds, match=why):
            roots.config_file(name)
    assert "configs/tiny.yaml" in roots.config_files()


def test_extends_chain_stays_inside_the_roots(roots: Roots, tmp_path: Path):
    outside = _shadow(tmp_path / "shadow.yaml")
    (tmp_path / "cfgs" / "a.yaml").write_text("extends: b.yaml\nname: a\n")
    (tmp_path / "cfgs" / "b.yaml").write_text(f"extends: {outside}\nname: b\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "cfgs" / "a.yaml", roots=roots)
    assert "outside the config roots" in str(err.value) and SECRET not in str(err.value)
    (tmp_path / "cfgs" / "b.yaml").write_text(f"extends: {TINY}\nname: b\n")
    assert load_config(tmp_path / "cfgs" / "a.yaml", roots=roots).name == "a"


def test_data_paths_only_under_the_data_roots(roots: Roots, tmp_path: Path):
    data = tmp_path / "data"
    (data / "link").symlink_to("/etc")
    roots.check_data({"data.train": str(data / "train"), "data.val": str(data / "v*" / "*.txt"),
                      "data.manifest": "s3://bucket/corpus/manifest.jsonl", "tokenizer.path": None})
    for field, value in [("data.train", "/etc"), ("data.val", str(data / ".." / "x")),
                         ("data.manifest", str(data / "link" / "passwd")), ("data.train", "s3://bucket/other"),
                         ("data.val", "s3://bucket/corpus/../other")]:
        with pytest.raises(OutOfBounds, match=f"{field}: .* is outside the data roots"):
            roots.check_data({field: value})


@pytest.mark.parametrize("content", [
    f"root:$y$j9T${SECRET}:19000:0:99999:7:::\n",                                       # /etc/shadow
    f"apiVersion: v1\nkind: Secret\nmetadata: {{name: x}}\ndata:\n  password: {SECRET}\n",   # a Secret
    f"clusters:\n- cluster: {{server: https://k8s, token: {SECRET}}}\n",                   # a kubeconfig
    f"name: [unclosed {SECRET}\n",                                                     # broken YAML
    f"- {SECRET}\n",                                                                   # not a mapping
])
def test_a_file_that_is_no_config_is_refused_without_echoing_it(tmp_path: Path, content: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    assert SECRET not in str(err.value) and "password" not in str(err.value)
    via = tmp_path / "via.yaml"
    via.write_text(f"extends: {bad}\nname: x\n")
    proc = taxiway("preflight", "-c", str(via))
    assert proc.returncode == 2 and SECRET not in proc.stdout + proc.stderr


def test_typos_get_a_did_you_mean(tmp_path: Path):
    typo = tmp_path / "typo.yaml"
    typo.write_text(f"extends: {TINY}\ntrian:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(typo)
    assert err.value.errors == {"trian": "not a config section (did you mean 'train'?)"}
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["train.stepz=5", "trian.lr=1"])
    assert "did you mean 'train'?" in err.value.errors["trian"]
    with pytest.raises(ConfigError) as err:
        load_config(TINY, ["train.stepz=5"])
    assert err.value.errors == {"train.stepz": "unknown field (did you mean 'steps'?)"}
