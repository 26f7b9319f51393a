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
    for field, value in [("data.train", "/etc"), ("data.manifest", str(data / "link" / "passwd")),
                         ("data.train", "s3://bucket/other"), ("data.val", "s3://bucket/corpus/../other")]:
        with pytest.raises(OutOfBounds, match=f"{field}: .* is outside the data roots"):
            roots.check_data({field: value})
    # fsspec reads a :: chain as a URI whatever follows: judged as one, and no URI root starts with it
    for field, value in [("data.train", "simplecache::relative/path"), ("data.val", "simplecache::s3://bucket/corpus/v")]:
        with pytest.raises(OutOfBounds, match=f"{field}: .* is outside the data roots"):
            roots.check_data({field: value})
    for value in ("relative/train", "~/train", "train"):  # what the worker's working folder makes of it
        with pytest.raises(OutOfBounds, match="data.train: .* is relative"):
            roots.check_data({"data.train": value})
    for field, value in [("data.val", str(data / ".." / "x")), ("data.train", f"{data}/tr[a]in/../../../../etc/pass*"),
                         ("data.manifest", f"{data}/x[/../../shadow.yaml")]:
        with pytest.raises(OutOfBounds, match=f"{field}: .* has a '..' segment"):
            roots.check_data({field: value})


def test_data_roots_from_the_environment_keep_their_uris(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """TAXIWAY_DATA_ROOTS is split at os.pathsep, but not inside a URI's ``://``, its port or a ``::`` chain;
    a relative entry after a ``:`` is an entry of its own (TAXIWAY_CONFIG_ROOTS is split the same way)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TAXIWAY_DATA_ROOTS", f"{tmp_path}/a:s3://bucket/landing/:{tmp_path}/b:simplecache::s3://c/d"
                       f":https://minio:9000/data:rel:s3://e:{tmp_path}/f:")
    assert Roots.from_env().data == (f"{tmp_path}/a", "s3://bucket/landing", f"{tmp_path}/b", "simplecache::s3://c/d",
                                     "https://minio:9000/data", f"{tmp_path}/rel", "s3://e", f"{tmp_path}/f")
    monkeypatch.setenv("TAXIWAY_CONFIG_ROOTS", f"{tmp_path}/x:configs")
    assert Roots.from_env().configs[:2] == (tmp_path / "x", tmp_path / "configs")


def test_data_globs_and_folders_are_checked_file_by_file(roots: Roots, tmp_path: Path):
    """A glob's fixed prefix may lie inside a root while what it matches does not: every file a
    data field expands to is checked after symlinks are resolved, and named (never read)."""
    data, outside = tmp_path / "data", _shadow(tmp_path / "passwd")
    (data / "train").mkdir()
    (data / "train" / "ok.txt").write_text("a document\n")
    (data / "train" / "alias.txt").symlink_to(data / "train" / "ok.txt")  # a link that stays inside is fine
    (data / "link").symlink_to(tmp_path)
    roots.check_data({"data.train": str(data / "train"), "data.val": f"{data}/tr[a]in/*.txt"})
    (data / "train" / "env.txt").symlink_to("/proc/self/environ")
    (data / "train" / "shadow.txt").symlink_to(outside)
    for field, value in [("data.train", str(data / "train")), ("data.val", f"{data}/tr[a]in/*.txt")]:
        with pytest.raises(OutOfBounds) as err:
            roots.check_data({field: value})
        message = str(err.value)
        assert message.startswith(f"{field}: ") and f" in {value!r} resolve outside the data roots" in message
        assert "env.txt" in message and "shadow.txt" in message and "ok.txt" not in message
        assert SECRET not in message and str(outside) not in message and str(tmp_path) not in message.split(" in ")[0]
    with pytest.raises(OutOfBounds, match=r"data.val: link/passwd in '.*/l\[i\]nk/pass\*' resolves outside"):
        roots.check_data({"data.val": f"{data}/l[i]nk/pass*"})


def test_a_triggered_runs_data_is_checked_before_any_file_is_read(home: Path):
    """The attack of issue 31: a glob whose prefix is a data root and whose ``..`` climbs out, with
    unlisted files allowed so preflight would read them. The first task refuses it."""
    from taxiway_airflow.tasks.common import conf_config

    conf = {"data": {"train": f"{home}/tr[a]in/../../../../../../../../etc/pass*"}, "preflight": {"allow_unlisted": True}}
    with pytest.raises(OutOfBounds, match=r"data.train: .* has a '..' segment"):
        conf_config(conf)
    # the run's own evaluation sets: each entry held to the roots, named by its index, file by file
    (home / "data" / "mine").mkdir(parents=True)
    (home / "data" / "mine" / "env.txt").symlink_to("/proc/self/environ")
    conf = {"eval": {"report_sets": [f"{home}/data/mine", "/etc"]}}
    with pytest.raises(OutOfBounds, match=r"eval.report_sets\[0\]: env.txt in .* resolves outside the data roots .*; "
                                          r"eval.report_sets\[1\]: '/etc' is outside the data roots"):
        conf_config(conf)
    with pytest.raises(OutOfBounds, match=r"eval.report_sets\[0\]: '.*/data/nothing' holds no files"):
        conf_config({"eval": {"report_sets": [f"{home}/data/nothing"]}})  # a typo fails before any compute


def test_the_default_data_roots_hold_data_not_the_deployments_state(home: Path, monkeypatch: pytest.MonkeyPatch):
    """Without TAXIWAY_DATA_ROOTS a trigger may read ``$TAXIWAY_HOME``'s data, demo-data and landing
    folders, never MLflow's database and artifacts, Airflow's home, other runs or the cache; the demo
    config (``make demo``) and the landing zone of the base config lie inside."""
    monkeypatch.delenv("TAXIWAY_DATA_ROOTS")
    (home / "cache").unlink()  # this test's own cache, not the session's shared one (linked into every home)
    for name in ("mlflow.db", "mlartifacts/0/x", "airflow/airflow.cfg", "runs/other/config.yaml", "cache/packed"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("x")
    roots = Roots.from_env()
    for name in ("mlflow.db", "mlartifacts", "airflow", "runs/other", "cache", ""):
        with pytest.raises(OutOfBounds, match="is outside the data roots"):
            roots.check_data({"data.manifest": str(home / name)})
    cfg = load_config(REPO / "configs" / "demo.yaml")
    roots.check_data({f: str(getattr(cfg.data, f.split(".")[1])) for f in ("data.train", "data.val", "data.manifest")}
                     | {"refresh.landing": cfg.refresh.landing, "source": str(home / "data" / "incoming")})


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
