"""FSDP2 (``fully_shard``) on CPU/gloo with 2 processes (one node): trains the same model as DDP, writes the same
full-state checkpoint format, and resumes bitwise after a SIGKILL."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_corpus import (
    events,
    finish_gang,
    kill9,
    make_corpus,
    read_jsonl,
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
    per gang instead of two; 2 nodes over loopback: tests/test_trainer_resume.py)."""
    for cfg, packed in make_corpus(tmp_path_factory):
        yield with_overrides(cfg, compute={"nodes": 1, "procs_per_node": 2}), packed


def _model(run_dir: Path, step: int = 16) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / f"step-{step:08d}" / "model.pt", weights_only=True)


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
    for h in running:
        finish_gang(h)

    started = events(ref, "training_started")[0]
    assert started["parallel"] == "fsdp" and started["local_parameters"] < 0.6 * started["parameters"]  # sharded
    assert events(ddp, "training_started")[0]["local_parameters"] == started["parameters"]  # replicated
    a, b = _model(ref), _model(killed)
    assert all(torch.equal(a[k], b[k]) for k in a), "FSDP resume after SIGKILL is not bitwise identical"
    opt_a = torch.load(ref / "checkpoints" / "step-00000016" / "optim.pt", weights_only=True)["state"]
    opt_b = torch.load(killed / "checkpoints" / "step-00000016" / "optim.pt", weights_only=True)["state"]
    assert all(torch.equal(opt_a[p][k], opt_b[p][k]) for p in opt_a for k in opt_a[p])
    assert [e["global_step"] for e in events(killed, "resumed")] == [4]

    # the same training as DDP (reduce-scatter vs all-reduce may round differently, nothing more)
    d = _model(ddp)
    assert a.keys() == d.keys()
    assert all(torch.allclose(a[k], d[k], rtol=1e-4, atol=1e-5) for k in a)
    # full-state checkpoint: loads into a plain GPT with the exact key set
    arch.build(TrainSpec.load(ref / "train" / "spec.json").model).load_state_dict(a)

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


def test_fsdp_snapshot_shares_no_tensor_with_live_training(tmp_path: Path):
    """The async writer serializes the snapshot while training goes on: a tensor still shared with
    the live model or optimizer (FSDP returns Adam's ``step`` counters as they are) would be written
    with a later step's value, and the resume would not be bitwise."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    from trainer import parallel

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        fully_shard(model)
        optim = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 4)).sum().backward()
        optim.step()
        model_state, optim_state, fresh = parallel.full_state(model, optim, "fsdp")
        before = {k: {n: t.clone() for n, t in s.items()} for k, s in optim_state["state"].items()}
        weights = {k: t.clone() for k, t in model_state.items()}
        model(torch.randn(2, 4)).sum().backward()
        optim.step()
        assert fresh
        assert all(torch.equal(t, before[k][n]) for k, s in optim_state["state"].items() for n, t in s.items())
        assert all(torch.equal(t, weights[k]) for k, t in model_state.items())
    finally:
        dist.destroy_process_group()
