"""Every CLI stage on the tiny config, chained through one run folder, with the exit-code contract."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import TINY, cli, taxiway


@pytest.fixture(scope="module")
def cli_home(tmp_path_factory) -> dict[str, str]:
    home = tmp_path_factory.mktemp("cli-home")
    env = {"TAXIWAY_HOME": str(home)}
    proc = taxiway("demo-data", str(home / "demo-data"), "--max-files", "120", env=env, check=True)
    assert proc.stdout.strip().splitlines()[-1].endswith("manifest.jsonl")
    return env


def _ok(proc):
    assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _last_line(proc) -> Path:
    return Path(proc.stdout.strip().splitlines()[-1])


def test_demo_data_is_deterministic(tmp_path: Path):
    a = taxiway("demo-data", str(tmp_path / "a"), "--seed", "3", "--max-files", "30", check=True)
    b = taxiway("demo-data", str(tmp_path / "b"), "--seed", "3", "--max-files", "30", check=True)
    c = taxiway("demo-data", str(tmp_path / "c"), "--seed", "4", "--max-files", "30", check=True)
    assert _last_line(a).read_text() == _last_line(b).read_text()
    assert _last_line(a).read_text() != _last_line(c).read_text()
    rows = [json.loads(line) for line in _last_line(a).read_text().splitlines()]
    assert {r["split"] for r in rows} == {"train", "val"} and len(rows) == 30
    refused = taxiway("demo-data", str(tmp_path / "a"))
    assert refused.returncode == 2 and "--force" in refused.stderr


def test_manifest_command_matches_demo_manifest(tmp_path: Path, cli_home):
    data = Path(cli_home["TAXIWAY_HOME"]) / "demo-data"
    out = taxiway("manifest", str(data), "-o", str(tmp_path / "m.jsonl"), check=True)
    assert _last_line(out).read_text() == (data / "manifest.jsonl").read_text()


def test_run_chains_every_stage_and_each_stage_reruns_on_its_folder(cli_home):
    """``taxiway run``: all five stages in one run folder; then a stage run again finds its work done
    (tokenize: the cache, on one process or two; register: the same version), ``summary`` reads the
    newest registered run and ``schema`` prints the config's JSON schema."""
    run = taxiway("run", "-c", str(TINY), env=cli_home, check=True)
    registered = json.loads(_last_line(run).read_text())
    assert registered["alias"] == "champion"
    run_dir = _last_line(run).parent
    report = json.loads((run_dir / "preflight" / "report.json").read_text())
    assert report["passed"] and set(report["checks"]) == {"manifest", "documents", "duplicates", "overlap"}
    assert report["overlap"]["contaminated_fraction"] <= 0.05
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "succeeded" and status["step"] == 30
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-00000020", "step-00000030"]
    assert json.loads((run_dir / "eval" / "report.json").read_text())["passed"]
    assert (run_dir / "model" / "model.safetensors").exists()

    tok = taxiway("tokenize", "-c", str(TINY), env=cli_home, check=True)
    packed = json.loads(_last_line(tok).read_text())
    assert tok.stdout.startswith("cache hit") and packed["splits"]["train"]["windows"] > 0 and packed["dtype"] == "uint16"
    # on two processes, three shards (another run folder: the config differs) → the same dataset
    shards = taxiway("tokenize", "-c", str(TINY), "--workers", "2", "-s", "pack.shard_bytes=1000000", env=cli_home,
                     check=True)
    assert shards.stdout.startswith("cache hit") and _last_line(shards) == _last_line(tok)

    again = json.loads(_last_line(_ok(cli("register", "-c", str(TINY), env=cli_home))).read_text())
    assert again["version"] == registered["version"], "re-running register must not create a second version"
    summary = _ok(cli("summary", env=cli_home)).stdout
    assert f"version {registered['version']}" in summary and "champion" in summary, summary
    schema = json.loads(taxiway("schema", check=True).stdout)
    assert {"data", "train", "compute", "registry", "limits"} <= set(schema["properties"])

    # an attempt that died halfway left a run without artifacts: the retry starts that run over
    from pipelines.registry import RUN_KEY_TAG, client

    os.environ["TAXIWAY_HOME"], saved = cli_home["TAXIWAY_HOME"], os.environ["TAXIWAY_HOME"]
    try:
        c = client()
        exp = c.get_experiment_by_name("taxiway-tiny")
        dead = c.create_run(exp.experiment_id, tags={RUN_KEY_TAG: "crashed-attempt"}).info.run_id
        retried = json.loads(_last_line(_ok(cli("register", "-c", str(TINY), "--run-key", "crashed-attempt",
                                                env=cli_home))).read_text())
        assert retried["run_id"] != dead and c.get_run(dead).info.lifecycle_stage == "deleted"
        assert {a.path for a in c.list_artifacts(retried["run_id"], "model")} >= {"model/MLmodel", "model/artifacts"}
    finally:
        os.environ["TAXIWAY_HOME"] = saved


def test_bad_config_exits_2_naming_the_field(cli_home):
    proc = taxiway("preflight", "-c", str(TINY), "--set", "train.lr=-1", env=cli_home)
    assert proc.returncode == 2
    assert "train.lr" in proc.stderr and "greater than 0" in proc.stderr


def test_stage_out_of_order_exits_2(cli_home, tmp_path: Path):
    proc = taxiway("train", "-c", str(TINY), "--run-dir", str(tmp_path / "fresh"), env=cli_home)
    assert proc.returncode == 2 and "packed.json" in proc.stderr and "tokenize" in proc.stderr


def test_preflight_gate_fails_with_exit_1(cli_home, tmp_path: Path):
    data = tmp_path / "data"
    shutil.copytree(Path(cli_home["TAXIWAY_HOME"]) / "demo-data", data)
    victim = sorted((data / "train").iterdir())[0]
    shutil.copyfile(victim, data / "val" / "leaked.txt")   # contamination, and an unlisted file
    victim.write_text(victim.read_text() + "\n# tampered\n")  # size and hash mismatch
    sets = [f"data.train={data / 'train'}", f"data.val={data / 'val'}", f"data.manifest={data / 'manifest.jsonl'}"]
    proc = cli("preflight", "-c", str(TINY), *sum((["--set", s] for s in sets), []),
                   "--run-dir", str(tmp_path / "run"), env=cli_home)
    assert proc.returncode == 1, proc.stderr
    report = json.loads((tmp_path / "run" / "preflight" / "report.json").read_text())
    assert not report["passed"]
    problems = " ".join(report["checks"]["manifest"]["details"]["problems"])
    assert victim.name in problems and "leaked.txt" in problems
    assert any(p["val"] == "val/leaked.txt" for p in report["overlap"]["pairs"])


def test_malformed_manifest_exits_2(cli_home, tmp_path: Path):
    bad = tmp_path / "manifest.jsonl"
    bad.write_text('{"path": "../etc/passwd", "split": "train", "bytes": 1, "sha256": "' + "0" * 64 + '"}\n')
    proc = taxiway("preflight", "-c", str(TINY), "--set", f"data.manifest={bad}",
                   "--run-dir", str(tmp_path / "run"), env=cli_home)
    assert proc.returncode == 2
    assert f"{bad}:1" in proc.stderr and "escapes the data root" in proc.stderr
    assert not (tmp_path / "run" / "preflight" / "report.json").exists()
