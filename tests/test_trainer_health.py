"""Trainer health: non-finite steps, loss spikes, slow ranks, a stuck data loader, startup checks."""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from trainer_corpus import events, make_corpus, one_rank_spec, read_jsonl, same, saved, status, wait_for, with_overrides

from pipelines.launch import local
from pipelines.launch.spec import launch_spec, write_trainer_spec
from trainer import EXIT_DATA_STALL, EXIT_NONFINITE, EXIT_STARTUP
from trainer.loop import train


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def _ckpt(run_dir: Path, step: int) -> dict:
    return saved(run_dir / "checkpoints" / f"step-{step:08d}")


def test_nonfinite_steps_are_skipped_without_an_update(corpus, tmp_path: Path, monkeypatch):
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"steps": 6, "max_nonfinite_steps": 2}, checkpoint={"every_steps": 1})
    monkeypatch.setenv("TAXIWAY_TEST_NAN_STEPS", "3,5")  # not in a row: both skipped, the run goes on
    run = tmp_path / "nan"
    assert train(one_rank_spec(cfg, packed, run)) == 0
    assert [e["step"] for e in events(run, "nonfinite_step_skipped")] == [3, 5]
    assert status(run)["skipped_steps"] == 2
    s2, s3, s4 = _ckpt(run, 2), _ckpt(run, 3), _ckpt(run, 4)
    assert same(s2, s3), "a skipped step must not change the weights nor the optimizer state"
    assert not same({k: v for k, v in s3.items() if k.startswith("model/")},
                    {k: v for k, v in s4.items() if k.startswith("model/")}), "the next step updates again"
    metrics = {r["step"]: r for r in read_jsonl(run / "metrics.jsonl")}
    assert metrics[3]["loss"] is None and metrics[4]["loss"] > 0 and metrics[6]["skipped_steps"] == 2


def test_nonfinite_steps_in_a_row_stop_the_run_with_a_clear_error(corpus, tmp_path: Path, monkeypatch):
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"max_nonfinite_steps": 3})
    monkeypatch.setenv("TAXIWAY_TEST_NAN_STEPS", "3,4,5")
    run = tmp_path / "diverged"
    assert train(one_rank_spec(cfg, packed, run)) == EXIT_NONFINITE
    final = status(run)
    assert final["state"] == "failed" and "NaN/Inf" in final["error"] and "3 consecutive" in final["error"]
    assert "train.max_nonfinite_steps=3" in final["error"] and final["step"] == 4  # step 5 never completed
    assert events(run, "failed")[0]["exit_code"] == EXIT_NONFINITE


def test_loss_spike_is_logged_as_an_event(corpus, tmp_path: Path, monkeypatch):
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"steps": 30, "spike_window": 20, "spike_sigma": 6.0})
    monkeypatch.setenv("TAXIWAY_TEST_SPIKE_STEPS", "25")
    run = tmp_path / "spike"
    assert train(one_rank_spec(cfg, packed, run)) == 0
    spikes = events(run, "loss_spike")
    assert [e["step"] for e in spikes] == [25], spikes
    assert spikes[0]["loss"] > spikes[0]["threshold"] > spikes[0]["window_mean"]
    assert status(run)["skipped_steps"] == 0  # a spike is reported, not skipped


def test_world_size_other_than_configured_fails_at_startup(corpus, tmp_path: Path):
    cfg, packed = corpus
    run = tmp_path / "world"
    spec = dataclasses.replace(one_rank_spec(cfg, packed, run), world_size=2)
    assert train(spec) == EXIT_STARTUP
    final = status(run)
    assert final["state"] == "failed" and "world_size: 1 processes joined, the config asks for 2" in final["error"]
    assert not (run / "checkpoints").exists()


def test_nccl_without_a_gpu_fails_at_startup_with_the_reason(corpus, tmp_path: Path):
    cfg, packed = corpus
    run = tmp_path / "nccl"
    assert train(dataclasses.replace(one_rank_spec(cfg, packed, run), backend="nccl")) == EXIT_STARTUP
    assert "compute.backend is nccl but no CUDA device is visible" in status(run)["error"]


def _gang(cfg, packed: Path, run_dir: Path, **env: str) -> tuple[local.Handle, local.GangState]:
    write_trainer_spec(cfg, run_dir, packed)
    spec = launch_spec(cfg, run_dir)
    handle = local.submit(dataclasses.replace(spec, env={**spec.env, **env}))
    try:
        return handle, wait_for(lambda: (s := local.poll(handle)).state != local.RUNNING and s, 120, "the gang")
    finally:
        local.cleanup(handle, grace_s=5)


def test_slow_rank_is_named_and_startup_checks_are_utc_events(corpus, tmp_path: Path):
    cfg, packed = corpus
    run = tmp_path / "slow"
    _, state = _gang(cfg, packed, run, TAXIWAY_TEST_SLOW_RANK="1:0.15")
    assert state.state == local.SUCCEEDED, state.detail
    assert status(run)["slow_ranks"] == [1]
    named = events(run, "slow_ranks")
    # 5 consecutive slow steps; DDP's second forward waits once for every rank (bucket rebuild), so 5..7
    assert named[0]["ranks"] == [1] and 5 <= named[0]["step"] <= 7
    times = [r["rank_step_time_s"] for r in read_jsonl(run / "metrics.jsonl")]
    # rank 1 sleeps 0.15 s in every step; rank 0's own step time (the wait for rank 1 excluded) is a
    # fraction of it: relative, since absolute step times depend on the machine's load
    assert all(t[1] > 0.15 for t in times) and statistics.median(t[0] for t in times) < 0.5 * min(t[1] for t in times)

    startup = {e["event"]: e for e in events(run)}
    for name in ("rendezvous_reached", "check_devices_visible", "check_dev_shm", "check_world_size",
                 "check_versions", "startup_checks"):
        assert name in startup, name
        assert startup[name]["level"] == "info"
        assert datetime.fromisoformat(startup[name]["time"]).utcoffset() == timedelta(0)
    assert startup["check_world_size"]["world_size"] == startup["check_world_size"]["expected"] == 2
    assert set(startup["check_versions"]["versions"]) == {"0", "1"}
    assert startup["check_dev_shm"]["shm"]["1"]["bytes"] > 0


def test_torch_version_mismatch_across_ranks_fails_fast_on_every_rank(corpus, tmp_path: Path):
    cfg, packed = corpus
    run = tmp_path / "skew"
    handle, state = _gang(cfg, packed, run, TAXIWAY_TEST_FAKE_TORCH="1:0.0.1")
    assert state.state == local.FAILED
    final = status(run)
    assert final["state"] == "failed" and "versions differ across ranks" in final["error"]
    assert '"torch": "0.0.1"' in final["error"] and "ranks [1]" in final["error"]
    assert [e["ok"] for e in events(run, "check_versions")] == [False]
    for node in handle.nodes:  # every rank stopped with the same reason, not one hung in a collective
        assert "startup checks failed" in Path(node.log).read_text()
    assert not (run / "checkpoints").exists()


def test_data_loader_watchdog_dumps_stacks_and_fails(corpus, tmp_path: Path):
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"steps": 100, "data_timeout_s": 2}, compute={"nodes": 1})
    run = tmp_path / "stall"
    spec = write_trainer_spec(cfg, run, packed)
    proc = subprocess.run([sys.executable, "-m", "trainer", "--spec", str(spec)], capture_output=True, text=True,
                          env={**os.environ, "TAXIWAY_TEST_STALL_DATA_STEP": "3"}, timeout=300)  # bounds a hang
    assert proc.returncode == EXIT_DATA_STALL, proc.stderr[-2000:]
    final = status(run)
    assert final["state"] == "failed" and "no batch for step 3 within 2 s" in final["error"]
    stacks = (run / "train" / "stacks-rank0.txt").read_text()
    assert "before_batch" in stacks and "_loop" in stacks  # where the main thread was stuck
    assert "before_batch" in proc.stderr
