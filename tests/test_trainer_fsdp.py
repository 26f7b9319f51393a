"""FSDP2 (``fully_shard``) on CPU/gloo with 2 processes (one node): trains the same model as DDP, writes the same
sharded checkpoint format, and resumes bitwise after a SIGKILL."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_corpus import (
    events,
    finish_gang,
    kill9,
    make_corpus,
    read_jsonl,
    same,
    saved,
    saved_model,
    status,
    submit_gang,
    wait_for,
    with_overrides,
)

from pipelines.launch import local
from trainer import arch, checkpoint
from trainer.spec import TrainSpec


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """World size 2 as one node of two processes: sharding is about ranks, not machines (one torchrun
    per gang instead of two; 2 nodes over loopback: tests/test_trainer_resume.py). A global batch of
    12 windows: 2 ranks x 6 or 3 ranks x 4 take the same windows in the same order."""
    for cfg, packed in make_corpus(tmp_path_factory):
        yield with_overrides(cfg, compute={"nodes": 1, "procs_per_node": 2}, train={"batch_size": 6}), packed


def test_fsdp_matches_ddp_and_resumes_bitwise(corpus, tmp_path: Path):
    cfg, packed = corpus
    fsdp = with_overrides(cfg, train={"parallel": "fsdp"})
    ref, ddp, killed, bf16 = (tmp_path / n for n in ("fsdp", "ddp", "fsdp-killed", "fsdp-bf16"))
    running = [submit_gang(fsdp, packed, ref), submit_gang(cfg, packed, ddp),
               submit_gang(with_overrides(fsdp, train={"precision": "bf16", "steps": 4}), packed, bf16)]
    handle = submit_gang(fsdp, packed, killed, TAXIWAY_TEST_HOLD="step:6")
    wait_for((killed / "train" / "held-step-6").exists, 120, "rank 0 to hold at step 6")
    # the step-4 checkpoint is written in the background: holding at step 6 does not mean it is committed
    wait_for(lambda: checkpoint.latest_valid(killed / "checkpoints"), 120, "the step-4 checkpoint to be committed")
    kill9(local.processes(handle.gang_id))
    wait_for(lambda: local.poll(handle).state != local.RUNNING, 30, "the killed gang to be gone")
    local.cleanup(handle, grace_s=5)
    running.append(submit_gang(fsdp, packed, killed))
    finish_gang(running.pop(0))
    # the reference's step-8 checkpoint (2 ranks, FSDP) resumed by 3 ranks, under FSDP and under DDP
    wider = {kind: tmp_path / f"{kind}-3-ranks" for kind in ("fsdp", "ddp")}
    for kind, run in wider.items():
        shutil.copytree(ref / "checkpoints" / "step-00000008", run / "checkpoints" / "step-00000008")
        three = with_overrides(cfg, compute={"procs_per_node": 3}, train={"parallel": kind, "batch_size": 4})
        running.append(submit_gang(three, packed, run))
    for h in running:
        finish_gang(h)

    started = events(ref, "training_started")[0]
    assert started["parallel"] == "fsdp" and started["local_parameters"] < 0.6 * started["parameters"]  # sharded
    assert events(ddp, "training_started")[0]["local_parameters"] == started["parameters"]  # replicated
    assert same(saved(ref / "checkpoints" / "step-00000016"), saved(killed / "checkpoints" / "step-00000016")), \
        "FSDP resume after SIGKILL is not bitwise identical"
    a = saved_model(ref, 16)
    assert [e["global_step"] for e in events(killed, "resumed")] == [4]

    # on 3 ranks, the same model and optimizer state as the 2 ranks that wrote it: the 8 steps after it
    # end where the reference's did (the same global batches; 3-way reductions round differently)
    full = saved(ref / "checkpoints" / "step-00000016")
    for kind, run in wider.items():
        (resumed,) = events(run, "resumed")
        assert (resumed["global_step"], resumed["written_by_world"]) == (8, 2)
        assert events(run, "training_started")[0]["world_size"] == 3
        got = saved(run / "checkpoints" / "step-00000016")
        assert got.keys() == full.keys()
        far = [k for k in full if not torch.allclose(full[k], got[k], rtol=1e-4, atol=1e-5)]
        assert far == [], (kind, far)

    # the same training as DDP (reduce-scatter vs all-reduce may round differently, nothing more)
    d = saved_model(ddp, 16)
    assert a.keys() == d.keys()
    assert all(torch.allclose(a[k], d[k], rtol=1e-4, atol=1e-5) for k in a)
    # a sharded checkpoint read whole has the key set of the plain model, the tied head saved once (as the embedding)
    loaded = arch.build(TrainSpec.load(ref / "train" / "spec.json").model).load_state_dict(a, strict=False)
    assert (loaded.missing_keys, loaded.unexpected_keys) == (["lm_head.weight"], [])
    # the export, streamed from both ranks' shards into one file, is the last checkpoint's model
    assert same(load_file(ref / "model" / "model.safetensors"), a)

    assert status(bf16)["state"] == "succeeded" and events(bf16, "training_started")[0]["bf16"] is True
    assert all(r["loss"] is not None for r in read_jsonl(bf16 / "metrics.jsonl"))


def test_a_parents_optimizer_state_is_handed_on_to_every_rank_under_ddp_and_fsdp(corpus, tmp_path: Path):
    """On 2 ranks a parent's full checkpoint is loaded as on one: the first step's loss is the same
    with or without it, the step after differs (Adam's moments came from the parent), and a DDP child
    continuing it trains as the FSDP one does (so its moments came from the parent too)."""
    cfg, packed = corpus
    parent = tmp_path / "parent"
    finish_gang(submit_gang(with_overrides(cfg, train={"steps": 8}), packed, parent))
    full = parent / "checkpoints" / "step-00000008"
    runs = {key: tmp_path / "-".join(key) for key in (("fsdp", "weights"), ("fsdp", "full"), ("ddp", "full"))}
    running = []
    for (parallel, kind), run in runs.items():
        child = with_overrides(cfg, train={"steps": 4, "rewarmup_steps": 2, "parallel": parallel})
        child = child.model_copy(update={"parent": "models:/x/1"})
        running.append(submit_gang(child, packed, run, parent=(parent / "model", full if kind == "full" else None)))
    for h in running:
        finish_gang(h)
    curves = {key: read_jsonl(run / "metrics.jsonl") for key, run in runs.items()}
    weights_only, continued = curves[("fsdp", "weights")], curves[("fsdp", "full")]
    assert weights_only[0]["loss"] == pytest.approx(continued[0]["loss"], abs=1e-6)
    assert weights_only[1]["loss"] != pytest.approx(continued[1]["loss"], abs=1e-6)
    assert curves[("ddp", "full")][1]["loss"] != pytest.approx(weights_only[1]["loss"], abs=1e-2)  # 0.3 apart here
    for parallel in ("ddp", "fsdp"):
        (loaded,) = events(runs[(parallel, "full")], "parent_loaded")
        assert loaded["optimizer_state"] == str(full) and loaded["global_step"] == 8
    assert [r["step"] for r in curves[("fsdp", "full")]] == [9, 10, 11, 12]
    for d, f in zip(curves[("ddp", "full")], curves[("fsdp", "full")], strict=True):
        assert d["loss"] == pytest.approx(f["loss"], abs=1e-4)
