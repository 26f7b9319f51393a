"""A full disk is found before it costs anything: before launch (the run's checkpoints would not
fit) and before each checkpoint (the next one would not fit), never as a torn folder or a crash.

The small disks are real: tmpfs mounts of a few hundred KiB (root only; elsewhere these tests skip).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from trainer_corpus import events, make_corpus, one_rank_spec, status, write_corpus

from conftest import TINY
from pipelines import disk, stages
from pipelines.config import RunConfig, load_config
from pipelines.errors import CheckFailed, kind_of
from pipelines.run_folder import RunFolder
from trainer import EXIT_DISK_FULL, DiskFull, arch, checkpoint, shards
from trainer.loop import train
from trainer.saver import Saver


@pytest.fixture
def small_disk() -> Iterator[Callable[[Path, int], Path]]:
    """``mount(path, bytes)``: a tmpfs of that size (rounded up to pages) at ``path``, unmounted after."""
    mounted: list[Path] = []

    def mount(path: Path, size: int) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "--lazy", str(path)], check=True)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def _commit_tiny(cfg: RunConfig, root: Path, step: int) -> Path:
    """A real checkpoint of ``cfg``'s model after one AdamW step, written by the trainer's commit."""
    torch.manual_seed(step)
    model = arch.build(arch.config_from_dict(cfg.model.trainer_fields(cfg.tokenizer.vocab_size), "config"))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.tokenizer.vocab_size, (2, 16))
    model(x, x)[1].backward()
    optim.step()
    checkpoint.write_rank_state(root, step, 0)
    saver = Saver(root, keep_last_n=10, async_save=False, device=torch.device("cpu"))
    try:
        saver.save(step, shards.state_of(model, optim), {"format": checkpoint.FORMAT})
        (done,) = saver.drain()
    finally:
        saver.close()
    return done.path


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_estimate_is_within_a_fifth_of_a_real_tiny_checkpoint(tmp_path: Path):
    cfg = load_config(TINY)
    real = _bytes(_commit_tiny(cfg, tmp_path, 1))
    assert 0.8 * real <= disk.checkpoint_bytes(cfg) <= 1.2 * real, (disk.checkpoint_bytes(cfg), real)


def test_training_is_refused_before_launch_when_its_checkpoints_do_not_fit(tmp_path: Path, small_disk):
    cfg = load_config(TINY, write_corpus(tmp_path / "data"))  # keep_last_n 2: three checkpoints at the peak
    run = small_disk(tmp_path / "run", 2 * disk.checkpoint_bytes(cfg))
    stages.prepare.prepare(cfg, run)
    stages.tokenize.reduce(cfg, run)

    with pytest.raises(disk.DiskFull) as caught:
        stages.train.spec(cfg, run)  # every launch writes the spec first
    message = str(caught.value)
    assert str(RunFolder(run).checkpoints) in message
    assert "3 checkpoints" in message and "checkpoint.keep_last_n=2" in message and "is free" in message
    assert kind_of(caught.value) is CheckFailed and not caught.value.retry  # exit 1, never retried
    assert not RunFolder(run).gang.exists() and not RunFolder(run).trainer_spec.exists()  # nothing launched


def test_a_relaunch_counts_the_checkpoints_it_already_holds(tmp_path: Path, small_disk):
    cfg = load_config(TINY)  # keep_last_n 2
    room = small_disk(tmp_path / "checkpoints", int(3.5 * disk.checkpoint_bytes(cfg)))
    disk.check_training_room(cfg, room)
    _commit_tiny(cfg, room, 1)
    _commit_tiny(cfg, room, 2)
    assert disk.free_bytes(room) < 3 * disk.checkpoint_bytes(cfg)
    disk.check_training_room(cfg, room)  # those two are the run's: one more fits, as it did at the start


def test_a_wsd_refresh_counts_the_stable_checkpoint_it_keeps(tmp_path: Path, small_disk):
    """A run continuing a parent under ``refresh.schedule: wsd`` pins its stable (pre-decay) checkpoint for
    the next refresh: one more than ``keep_last_n`` + the one being written."""
    wsd = load_config(TINY, ["parent=models:/m/1", "refresh.schedule=wsd", "refresh.decay_steps=10"])
    room = small_disk(tmp_path / "checkpoints", int(3.5 * disk.checkpoint_bytes(wsd)))
    disk.check_training_room(load_config(TINY, ["parent=models:/m/1"]), room)  # rewarm: three fit
    with pytest.raises(disk.DiskFull, match=r"4 checkpoints .*\+ the wsd stable state"):
        disk.check_training_room(wsd, room)


def test_a_checkpoint_that_fills_the_disk_leaves_nothing_torn(tmp_path: Path, small_disk, monkeypatch):
    """The space goes between the room check and the write (another writer took it): the sharded
    write fails ENOSPC inside DCP, and the folder being written is removed."""
    cfg = load_config(TINY)
    room = small_disk(tmp_path / "checkpoints", disk.checkpoint_bytes(cfg) // 2)  # the model fits, the optimizer state not
    monkeypatch.setattr(checkpoint, "ensure_room", lambda *args: None)

    with pytest.raises(DiskFull, match="the disk filled while checkpoint step-00000001.inprogress was written"):
        _commit_tiny(cfg, room, 1)
    assert list(room.iterdir()) == []


def test_trainer_fails_before_the_checkpoint_that_does_not_fit(corpus, tmp_path: Path, small_disk):
    cfg, packed = corpus  # 16 steps, a checkpoint every 4, keep_last_n 10; room for two and a half
    run = tmp_path / "run"
    room = small_disk(RunFolder(run).checkpoints, int(2.5 * disk.checkpoint_bytes(cfg)))

    assert train(one_rank_spec(cfg, packed, run)) == EXIT_DISK_FULL
    final = status(run)
    assert final["state"] == "failed" and final["step"] == 12
    assert f"not enough free disk for checkpoint step-00000012 in {room}" in final["error"]
    assert "are free" in final["error"]
    assert events(run, "failed")[0]["error"] == final["error"]
    assert sorted(p.name for p in room.iterdir()) == ["step-00000004", "step-00000008"]  # no .inprogress
    assert checkpoint.latest_valid(room).name == "step-00000008"
