"""A run killed with SIGKILL three times (once in the middle of a checkpoint write) and resumed ends
bitwise identical to an uninterrupted run: 2 nodes x 1 process over loopback, the real local gang."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_corpus import events, finish_gang, kill9, make_corpus, saved, status, submit_gang, wait_for

from pipelines.launch import local
from trainer import checkpoint, shards


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def _kill_when_held(handle: local.Handle, marker: Path, committed: str | None = None) -> None:
    """SIGKILL every process of the gang (supervisors, torchrun agents, trainers) once rank 0 holds
    (and, with ``committed``, once the background writer has committed that checkpoint: the hold
    stops the training loop, not the writer, which may lag on a busy machine)."""
    wait_for(marker.exists, 120, f"{marker.name}: {local.poll(handle).detail}", poll_s=0.02)
    if committed:
        checkpoints = marker.parent.parent / "checkpoints"
        wait_for(lambda: (c := checkpoint.latest_valid(checkpoints)) is not None and c.name == committed, 60,
                 f"{committed} to be committed")
    kill9(local.processes(handle.gang_id))
    wait_for(lambda: local.poll(handle).state != local.RUNNING, 30, "the killed gang to be seen as gone")
    local.cleanup(handle, grace_s=5)


def test_sigkill_three_times_then_resume_is_bitwise_identical(corpus, tmp_path: Path):
    cfg, packed = corpus  # 16 steps, a checkpoint every 4, deterministic, 2 nodes x 1 process
    ref, run = tmp_path / "uninterrupted", tmp_path / "killed"
    reference = submit_gang(cfg, packed, ref)  # runs alongside the killed attempts

    # 1: between checkpoints (rank 0 stops after step 6; step 4 is the newest checkpoint)
    _kill_when_held(submit_gang(cfg, packed, run, TAXIWAY_TEST_HOLD="step:6"), run / "train" / "held-step-6",
                    committed="step-00000004")
    assert checkpoint.latest_valid(run / "checkpoints").name == "step-00000004"

    # 2: in the middle of writing step 8 (every rank's shards written, meta.json and checksums.json not yet)
    _kill_when_held(submit_gang(cfg, packed, run, TAXIWAY_TEST_HOLD="write:8"), run / "train" / "held-write-8")
    torn = run / "checkpoints" / "step-00000008.inprogress"
    assert (torn / ".metadata").exists() and {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in torn.iterdir()}
    assert not (torn / "checksums.json").exists()
    assert checkpoint.latest_valid(run / "checkpoints").name == "step-00000004"

    # 3: after two more checkpoints of the third attempt (which threw the torn folder away)
    _kill_when_held(submit_gang(cfg, packed, run, TAXIWAY_TEST_HOLD="step:14"), run / "train" / "held-step-14",
                    committed="step-00000012")
    assert checkpoint.latest_valid(run / "checkpoints").name == "step-00000012"

    finish_gang(submit_gang(cfg, packed, run))
    finish_gang(reference)

    resumed = [(e["global_step"], Path(e["path"]).name) for e in events(run, "resumed")]
    assert resumed == [(4, "step-00000004"), (4, "step-00000004"), (12, "step-00000012")]
    # attempt 2's writer held step 8, but its training loop went on: when it reached step 12 before
    # the kill, both ranks had written step 12's RNG files, so that folder is torn too
    removed = [e["path"] for e in events(run, "torn_checkpoint_removed")]
    assert removed in ([str(torn)], [str(torn), str(run / "checkpoints" / "step-00000012.inprogress")]), removed
    final = status(run)
    assert final["state"] == "succeeded" and final["step"] == 16 and final["restarts"] == 3

    a, b = saved(ref / "checkpoints" / "step-00000016"), saved(run / "checkpoints" / "step-00000016")
    assert a.keys() == b.keys() and len(a) > 20
    different = [k for k in a if not torch.equal(a[k], b[k])]
    assert different == [], different
    from safetensors.torch import load_file

    exported_a, exported_b = load_file(ref / "model" / "model.safetensors"), load_file(run / "model" / "model.safetensors")
    assert all(torch.equal(exported_a[k], exported_b[k]) for k in exported_a)


def test_rng_state_reads_back_weights_only_and_an_old_pickle_is_not_run(tmp_path: Path):
    """A checkpoint may be a parent downloaded from MLflow: every file is read with weights_only=True.
    The RNG state (numpy's included) round-trips so; a file pickled the old way is refused, not run."""
    import random

    import numpy as np

    checkpoint.write_rank_state(tmp_path, 1, 0)
    expected = (random.random(), np.random.random(), torch.rand(1).item())
    state = checkpoint._rng(checkpoint.inprogress_dir(tmp_path, 1) / "rng-rank0.pt")
    checkpoint.set_rng_state(state)
    assert (random.random(), np.random.random(), torch.rand(1).item()) == expected

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    torch.save({"numpy": np.random.get_state(), "payload": Payload()}, tmp_path / "old.pt")
    assert checkpoint._rng(tmp_path / "old.pt") is None and not (tmp_path / "ran").exists()


def test_a_checkpoint_index_naming_anything_else_is_refused_unread(tmp_path: Path):
    """DCP pickles its index (``.metadata``); a checkpoint may come from elsewhere, so the index is read
    with only the classes an index is made of, and one naming anything else runs nothing."""
    import pickle

    from trainer import TrainerError

    class Payload:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    (tmp_path / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(TrainerError, match=r"\.metadata: refused unread: it names pathlib.*Path.touch"):
        shards.read_whole(tmp_path)
    assert not (tmp_path / "ran").exists()
