"""Trainer: exact resume from the newest valid checkpoint; torn or corrupt ones are skipped."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
from trainer_corpus import same, saved, write_corpus

from conftest import TINY
from pipelines.config import load_config
from pipelines.launch.spec import write_trainer_spec
from trainer import checkpoint
from trainer.loop import train
from trainer.spec import TrainSpec


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer")
    env = pytest.MonkeyPatch()
    env.setenv("TAXIWAY_HOME", str(root / "home"))
    cfg = load_config(TINY, [*write_corpus(root), "train.steps=12", "checkpoint.every_steps=4", "checkpoint.keep_last_n=5",
                             "train.deterministic=true"])
    from pipelines import tokenize

    yield cfg, tokenize.pack_splits(cfg).path
    env.undo()


def _spec(cfg, packed_path: Path, run_dir: Path) -> TrainSpec:
    """In this process: one rank (the config's gang would be 2 nodes)."""
    return dataclasses.replace(TrainSpec.load(write_trainer_spec(cfg, run_dir, packed_path)), world_size=1)


def _state(run_dir: Path) -> dict:
    return saved(run_dir / "checkpoints" / "step-00000012")


def test_resume_is_bitwise_identical(packed, tmp_path: Path):
    cfg, path = packed
    assert train(_spec(cfg, path, tmp_path / "a")) == 0
    ref = _state(tmp_path / "a")

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for late in ("step-00000008", "step-00000012"):
        shutil.rmtree(tmp_path / "b" / "checkpoints" / late)
    assert train(_spec(cfg, path, tmp_path / "b")) == 0
    resumed = _state(tmp_path / "b")
    assert same(ref, resumed), "model and optimizer state after the resume differ"
    status = json.loads((tmp_path / "b" / "status.json").read_text())
    assert status["state"] == "succeeded" and status["restarts"] == 1
    metrics = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 12


def test_corrupt_and_torn_checkpoints_are_skipped(packed, tmp_path: Path, caplog):
    cfg, path = packed
    assert train(_spec(cfg, path, tmp_path / "r")) == 0
    ckpts = tmp_path / "r" / "checkpoints"
    (ckpts / "step-00000012" / "__0_0.distcp").write_bytes(b"garbage")          # corrupt
    (ckpts / "step-00000016.inprogress").mkdir()                               # torn, never renamed
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        assert checkpoint.latest_valid(ckpts).name == "step-00000008"
    assert "step-00000012" in caplog.text and "checksum mismatch" in caplog.text
    assert checkpoint.is_valid(ckpts / "step-00000008") == (True, "ok")


def test_failed_node_is_reported_with_its_log(packed, tmp_path: Path):
    from pipelines.launch import local
    from pipelines.launch.spec import launch_spec

    cfg, path = packed
    run_dir = tmp_path / "bad"
    spec = write_trainer_spec(cfg, run_dir, path)
    raw = json.loads(spec.read_text())
    raw["data"] = str(tmp_path / "nowhere")
    spec.write_text(json.dumps(raw))
    with pytest.raises(local.GangFailed, match="exited with code"):
        local.run_to_end(launch_spec(cfg, run_dir), poll_s=0.2)


def test_sigterm_checkpoints_and_exits_canceled(packed, tmp_path: Path):
    """Eviction or cancel: finish the step, save a checkpoint, state 'canceled', exit 143."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg, path = packed
    run_dir = tmp_path / "cancel"
    spec = write_trainer_spec(cfg.model_copy(update={"train": cfg.train.model_copy(update={"steps": 100_000}),
                                                     "compute": cfg.compute.model_copy(update={"nodes": 1})}),
                              run_dir, path)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--spec", str(spec)], env=os.environ,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    status_file = run_dir / "status.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if status_file.exists():
            status = json.loads(status_file.read_text())
            if status["state"] == "running" and status["step"] >= 2:
                break
        time.sleep(0.1)
    else:
        proc.kill()
        raise AssertionError(f"trainer did not start: {proc.communicate()[0].decode()[-2000:]}")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out.decode()[-2000:]
    status = json.loads(status_file.read_text())
    assert status["state"] == "canceled"
    newest = checkpoint.latest_valid(run_dir / "checkpoints")
    assert newest is not None and newest.name == f"step-{status['step']:08d}"


def test_smoke_passes_in_seconds_and_fails_fast_on_bad_input(packed, tmp_path: Path):

    from pipelines import stages
    from trainer import fsio

    cfg, path = packed
    run_dir = tmp_path / "smoke"
    fsio.write_json(run_dir / "tokenize" / "packed.json", {"path": str(path), "key": "k", "cache_hit": True})
    result = stages.train.smoke(cfg, run_dir)
    assert result["smoke"] == "passed" and result["step"] == 3 and result["restarts"] == 1
    assert not (run_dir / "checkpoints").exists(), "smoke must not touch the real run's checkpoints"
    bad = cfg.model_copy(update={"model": cfg.model.model_copy(update={"block_size": 8})})  # seq_len 32 > 8
    with pytest.raises(stages.train.SmokeFailed, match="smoke test failed"):
        stages.train.smoke(bad, run_dir)


def test_status_is_rewritten_four_times_per_stall_window(packed, tmp_path: Path, monkeypatch):
    """The sensor sees progress only when status.json is rewritten; a 5 s cadence against a 6 s stall
    window took a loaded machine's slow step for a stall (CI: a fourth gang attempt where three were due)."""
    from trainer import loop

    cfg, path = packed
    short = cfg.model_copy(update={"compute": cfg.compute.model_copy(update={"stall_timeout_s": 6})})
    assert _spec(cfg, path, tmp_path / "default").status_every_s == 5.0
    cadences = []
    writer = loop.StatusWriter
    monkeypatch.setattr(loop, "StatusWriter", lambda *a, **k: cadences.append(k["every_s"]) or writer(*a, **k))
    assert train(_spec(short, path, tmp_path / "short")) == 0
    assert cadences == [1.5]
