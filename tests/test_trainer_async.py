"""Asynchronous checkpoints: a snapshot taken off the live tensors, written while training goes on,
the next save waiting for the previous one, and SIGTERM bounded by the grace period."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from trainer_corpus import (
    events,
    make_corpus,
    one_rank_spec,
    read_jsonl,
    same,
    saved,
    status,
    wait_for,
    with_overrides,
)

from pipelines.launch.spec import write_trainer_spec
from trainer import EXIT_CANCELED, TrainerError, checkpoint, shards
from trainer.loop import train
from trainer.model import GPT, GPTConfig
from trainer.saver import Saver


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def test_snapshot_is_taken_off_the_live_tensors(tmp_path: Path):
    """Training may change every tensor right after ``save`` returns: the checkpoint holds the old values."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=16, block_size=16))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randint(0, 64, (2, 16))
    model(x, x)[1].backward()
    optim.step()

    release = threading.Event()
    saver = Saver(tmp_path, keep_last_n=2, async_save=True, device=torch.device("cpu"), after_state=lambda step: release.wait(30))
    saver.reserve(shards.state_of(model, optim))
    live = shards.state_of(model, optim)
    expected = {f"model/{k}": v.clone() for k, v in live["model"].items()}
    expected |= {f"optim/{p}/{k}": v.clone() for p, s in live["optim"]["state"].items() for k, v in s.items()}
    saver.save(1, live, {"format": checkpoint.FORMAT, "global_step": 1})
    with torch.no_grad():  # the next training steps, while the checkpoint is being written
        for p in model.parameters():
            p.add_(1.0)
        for s in optim.state.values():
            s["exp_avg"].add_(1.0)
    assert saver.drain() == []  # still writing: held once the shards are written
    release.set()
    saver.wait()
    (done,) = saver.drain()
    assert done.step == 1 and checkpoint.is_valid(done.path) == (True, "ok")
    assert same(saved(done.path), expected)
    saver.close()


def test_a_failed_write_is_one_clear_error_raised_once_and_leaves_no_folder(tmp_path: Path, monkeypatch):
    """DCP reports a write failure as a ``CheckpointException``, a ``BaseException`` that no ``except
    Exception`` catches: the saver turns it into the trainer's own error, naming the checkpoint and what
    failed, raises it once (the loop's last ``wait`` in its ``finally`` must not raise it again), and
    removes the folder it was writing."""
    import errno

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=16))
    optim = torch.optim.AdamW(model.parameters())

    def broken(self, plan, planner):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(shards._HashingWriter, "write_data", broken)
    root = tmp_path / "checkpoints"
    saver = Saver(root, keep_last_n=2, async_save=True, device=torch.device("cpu"))
    checkpoint.write_rank_state(root, 3, 0)
    saver.save(3, shards.state_of(model, optim), {"format": checkpoint.FORMAT})
    assert wait_for(lambda: saver._pending.done(), 30, "the write to fail")
    assert saver.drain() == []  # seen by the next save or wait, which every rank reaches at the same step
    with pytest.raises(TrainerError, match=r"writing checkpoint step-00000003 failed: rank 0: OSError: .*Input/output"):
        saver.wait()
    saver.wait()
    saver.close()
    assert list(root.iterdir()) == []


def test_synchronous_mode_writes_the_same_checkpoints(corpus, tmp_path: Path):
    cfg, packed = corpus
    runs = {}
    for mode in (True, False):
        run = tmp_path / f"async-{mode}"
        assert train(one_rank_spec(with_overrides(cfg, checkpoint={"async_save": mode}), packed, run)) == 0
        runs[mode] = run
        saves = events(run, "checkpoint_saved")
        assert [e["step"] for e in saves] == [4, 8, 12, 16]
        assert [e["async_save"] for e in saves] == ([True] * 3 + [False] if mode else [False] * 4)
        assert [e["step"] for e in events(run, "checkpoint_committed")] == [4, 8, 12, 16]
    for step in (4, 16):
        assert same(*(saved(runs[m] / "checkpoints" / f"step-{step:08d}") for m in runs))


def test_training_goes_on_during_a_write_and_sigterm_is_bounded_by_the_grace(corpus, tmp_path: Path):
    """The writer stalls inside step 4's checkpoint: training continues to step 8, where the next save
    waits for it. SIGTERM then cannot complete a checkpoint; the trainer still exits 143 within the grace."""
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"steps": 100}, compute={"nodes": 1, "cancel_grace_s": 8})  # trainer: 3 s
    run = tmp_path / "held"
    spec = write_trainer_spec(cfg, run, packed)
    proc = subprocess.Popen([sys.executable, "-m", "trainer", "--spec", str(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env={**os.environ, "TAXIWAY_TEST_HOLD": "write:4"})
    try:
        wait_for((run / "train" / "held-write-4").exists, 60, "the writer to stall in step 4's checkpoint")
        current = wait_for(lambda: (s := status(run))["step"] == 8 and s, 30, "training to reach step 8")
        assert current["state"] == "checkpointing"
        torn = run / "checkpoints" / "step-00000004.inprogress"
        assert (torn / ".metadata").exists() and not (torn / "checksums.json").exists()
        assert checkpoint.latest_valid(run / "checkpoints") is None

        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == EXIT_CANCELED, out.decode()[-2000:]
        assert time.monotonic() - started > 2.5  # it waited out the grace for the writer (an upper bound is a hang: the timeout)
    finally:
        proc.kill()
    final = status(run)
    assert final["state"] == "canceled" and "grace period of 3 s" in final["error"]
    # from the stall until the end, the trainer never went past step 8: its save waited for step 4's write
    assert final["step"] == 8, "the save at step 8 must wait for the write of step 4"
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, 9))
    assert json.loads((run / "train" / "spec.json").read_text())["cancel_grace_s"] == 3
