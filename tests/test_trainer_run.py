"""What one run reports and continues: LR schedules, parent continuation, bf16 autocast, metrics and MFU."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
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
    saved_model,
    status,
    with_overrides,
)

from pipelines.launch.spec import write_trainer_spec
from trainer import shards
from trainer.fsio import sha256_file
from trainer.loop import train
from trainer.schedule import Schedule
from trainer.spec import TrainSettings, TrainSpec


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def _t(**over) -> TrainSettings:
    """The train section as the trainer's spec carries it."""
    from pipelines.config import TrainConfig

    fields = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, "steps": 110, "decay": "cosine", **over}
    return TrainSettings(**TrainConfig(**fields).model_dump())


def test_schedules_warm_up_decay_and_continue_without_a_jump():
    cosine = Schedule.from_config(_t())
    assert cosine.lr(0) == pytest.approx(0.1) and cosine.lr(9) == pytest.approx(1.0)
    assert cosine.lr(60) == pytest.approx(0.55) and cosine.lr(110) == pytest.approx(0.1)
    linear = Schedule.from_config(_t(decay="linear"))
    assert linear.lr(35) == pytest.approx(0.775) and linear.lr(60) == pytest.approx(0.55)
    # a child of a parent that stopped at global step 110 with LR 0.3: starts there, no warmup
    child = Schedule.from_config(_t(steps=50, min_lr=0.05), origin_step=110, start_lr=0.3)
    assert child.lr(110) == pytest.approx(0.3) and child.lr(160) == pytest.approx(0.05)
    assert all(child.lr(s) >= child.lr(s + 1) for s in range(110, 160))
    # a parent that ended below the child's min_lr is not pushed back up
    low = Schedule.from_config(_t(steps=50), origin_step=110, start_lr=0.01)
    assert {low.lr(s) for s in range(110, 161)} == {0.01}
    # a refresh re-warms: from the parent's final LR up to the peak in 5 steps, then decays to min_lr
    rewarm = Schedule.from_config(_t(steps=50, rewarmup_steps=5), origin_step=110, start_lr=0.3)
    assert rewarm.lr(110) == pytest.approx(0.44) and rewarm.lr(114) == pytest.approx(1.0)
    assert rewarm.lr(160) == pytest.approx(0.1) and all(rewarm.lr(s) >= rewarm.lr(s + 1) for s in range(114, 160))


def test_parent_continues_global_step_tokens_and_lr(corpus, tmp_path: Path):
    cfg, packed = corpus
    parent_run, child_run = tmp_path / "parent", tmp_path / "child"
    assert train(one_rank_spec(cfg, packed, parent_run)) == 0
    parent = json.loads((parent_run / "model" / "model.json").read_text())
    parent_metrics = read_jsonl(parent_run / "metrics.jsonl")
    assert parent["global_step"] == 16 and parent["final_lr"] == parent_metrics[-1]["lr"]

    child_cfg = with_overrides(cfg, train={"steps": 6}).model_copy(update={"parent": "models:/taxiway-tiny-gpt/1"})
    spec = TrainSpec.load(write_trainer_spec(child_cfg, child_run, packed, parent_weights=parent_run / "model"))
    assert train(dataclasses.replace(spec, world_size=1)) == 0
    metrics = read_jsonl(child_run / "metrics.jsonl")
    assert [r["step"] for r in metrics] == list(range(17, 23))
    tokens_per_step = parent_metrics[0]["tokens_seen"]
    assert metrics[-1]["tokens_seen"] == parent["tokens_seen"] + 6 * tokens_per_step
    assert metrics[0]["lr"] == pytest.approx(parent["final_lr"])  # continues, no warmup, no jump
    assert all(a["lr"] >= b["lr"] for a, b in zip(metrics, metrics[1:], strict=False))
    # the parent's weights, not a fresh init: the loss goes on from where the parent ended
    assert abs(metrics[0]["loss"] - parent_metrics[-1]["loss"]) < 0.5 < math.log(280) - metrics[0]["loss"]
    (loaded,) = events(child_run, "parent_loaded")
    assert loaded["global_step"] == 16 and loaded["uri"] == "models:/taxiway-tiny-gpt/1"

    child = json.loads((child_run / "model" / "model.json").read_text())
    assert child["global_step"] == 22 and child["parent"] == "models:/taxiway-tiny-gpt/1"
    assert child["lr_schedule"]["origin_step"] == 16 and child["lr_schedule"]["start_lr"] == parent["final_lr"]
    assert status(child_run)["step"] == status(child_run)["total_steps"] == 22

    # a restart of the child resumes its own checkpoint (global step 20), not the parent
    final = saved(child_run / "checkpoints" / "step-00000022")
    shutil.rmtree(child_run / "checkpoints" / "step-00000022")
    assert train(dataclasses.replace(spec, world_size=1)) == 0
    assert [e["global_step"] for e in events(child_run, "resumed")] == [20]
    assert same(final, saved(child_run / "checkpoints" / "step-00000022"))


def test_a_parent_kept_as_a_full_checkpoint_hands_on_its_optimizer_state(corpus, tmp_path: Path):
    """Same weights, same data, same seed: the first step's loss is the same with or without the
    parent's optimizer state; the step after differs, because Adam's moments came from the parent."""
    cfg, packed = corpus
    parent_run = tmp_path / "parent"
    assert train(one_rank_spec(with_overrides(cfg, train={"steps": 8}), packed, parent_run)) == 0
    child_cfg = with_overrides(cfg, train={"steps": 4, "rewarmup_steps": 2}).model_copy(update={"parent": "models:/x/1"})
    curves = {}
    for kind, full in (("weights", None), ("full", parent_run / "checkpoints" / "step-00000008")):
        run = tmp_path / kind
        spec = TrainSpec.load(write_trainer_spec(child_cfg, run, packed, parent_weights=parent_run / "model",
                                                 parent_checkpoint=full))
        assert train(dataclasses.replace(spec, world_size=1)) == 0
        (loaded,) = events(run, "parent_loaded")
        assert loaded["optimizer_state"] == (str(full) if full else None)
        curves[kind] = read_jsonl(run / "metrics.jsonl")
    assert curves["weights"][0]["loss"] == curves["full"][0]["loss"]
    assert curves["weights"][1]["loss"] != curves["full"][1]["loss"]
    # the re-warmup: from the parent's final LR up to the peak over 2 steps, then down
    parent_lr = json.loads((parent_run / "model" / "model.json").read_text())["final_lr"]
    lrs = [r["lr"] for r in curves["full"]]
    assert parent_lr < lrs[0] < lrs[1] == pytest.approx(cfg.train.lr) and lrs[3] < lrs[1]


def test_a_run_continues_its_parents_model_and_a_spec_that_does_not_fit_it_is_refused(corpus, tmp_path: Path):
    """A GPT version goes on as a GPT (its model.json, written before ``arch`` existed, names none) even
    where the config says llama and another depth; a trainer spec whose model differs from the parent's
    weights fails at the load, naming the parent."""
    cfg, packed = corpus
    gpt = with_overrides(cfg, model={"arch": "gpt"}, train={"steps": 1})
    assert train(one_rank_spec(gpt, packed, tmp_path / "p")) == 0
    exported = tmp_path / "p" / "model" / "model.json"
    old = json.loads(exported.read_text())
    exported.write_text(json.dumps({**old, "config": {k: v for k, v in old["config"].items() if k != "arch"}}))
    child = with_overrides(cfg, model={"n_layer": 3}).model_copy(update={"parent": "models:/x/1"})
    spec = TrainSpec.load(write_trainer_spec(child, tmp_path / "c", packed, parent_weights=tmp_path / "p" / "model"))
    assert (type(spec.model).__name__, spec.model.n_layer) == ("GPTConfig", cfg.model.n_layer)
    assert train(dataclasses.replace(spec, world_size=1)) == 0

    bigger = dataclasses.replace(spec, model=dataclasses.replace(spec.model, n_layer=3),
                                 paths=TrainSpec.load(write_trainer_spec(child, tmp_path / "d", packed,
                                                                         parent_weights=tmp_path / "p" / "model")).paths)
    assert train(dataclasses.replace(bigger, world_size=1)) == 1
    assert "does not fit the configured model" in status(tmp_path / "d")["error"]


def test_metrics_mfu_and_bf16_autocast(corpus, tmp_path: Path):
    cfg, packed = corpus
    runs = {}
    for precision in ("fp32", "bf16"):
        run = tmp_path / precision
        c = with_overrides(cfg, train={"steps": 4, "precision": precision, "peak_tflops": 0.5})
        assert train(one_rank_spec(c, packed, run)) == 0
        runs[precision] = read_jsonl(run / "metrics.jsonl")
        assert events(run, "training_started")[0]["bf16"] is (precision == "bf16")
    for record in runs["fp32"]:
        assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s", "rank_step_time_s"} <= set(record)
    # PaLM/nanoGPT FLOPs: 6 N + 12 L E T, over the 0.5 TFLOP/s given; N of the tiny Llama: the tied
    # embedding, per layer q, k, v, o (2 heads of 16, 2 key/value heads), SwiGLU 32 -> 96 and two norms
    n = 280 * 32 + 2 * (4 * 32 * 32 + 3 * 32 * 96 + 2 * 32) + 32
    flops_token = 6 * n + 12 * 2 * 32 * 32
    for r in runs["fp32"]:
        assert r["mfu"] == pytest.approx(flops_token * r["tokens_per_s"] / 0.5e12, rel=1e-2, abs=1e-4)
    # autocast ran: bf16 matmuls give a (slightly) different loss, still finite and close
    first = runs["fp32"][0]["loss"], runs["bf16"][0]["loss"]
    assert first[0] != first[1] and abs(first[0] - first[1]) < 0.05
    kept = saved_model(tmp_path / "bf16", 4)
    assert all(v.dtype == torch.float32 for v in kept.values()), "autocast keeps fp32 master weights"


def test_a_full_state_checkpoint_of_the_previous_format_resumes(corpus, tmp_path: Path):
    """Format 2 (the full state in model.pt and optim.pt, written by rank 0 before checkpoints were
    sharded) resumes: the run ends bitwise where one that never stopped does."""
    cfg, packed = corpus
    cfg = with_overrides(cfg, train={"steps": 8})
    ref, old = tmp_path / "ref", tmp_path / "old"
    assert train(one_rank_spec(cfg, packed, ref)) == 0
    source, folder = ref / "checkpoints" / "step-00000004", old / "checkpoints" / "step-00000004"
    folder.mkdir(parents=True)
    whole = shards.read_whole(source)
    model = whole["model"] | {"lm_head.weight": whole["model"]["model.embed_tokens.weight"]}  # format 2 kept the tie
    torch.save(model, folder / "model.pt")
    torch.save(whole["optim"], folder / "optim.pt")
    shutil.copy(source / "rng-rank0.pt", folder / "rng-rank0.pt")
    meta = json.loads((source / "meta.json").read_text()) | {"format": 2}
    (folder / "meta.json").write_text(json.dumps(meta))
    sums = {p.name: sha256_file(p) for p in sorted(folder.iterdir())}
    (folder / "checksums.json").write_text(json.dumps(sums))

    assert train(one_rank_spec(cfg, packed, old)) == 0
    assert [(e["global_step"], e["format"]) for e in events(old, "resumed")] == [(4, 2)]
    assert same(saved(old / "checkpoints" / "step-00000008"), saved(ref / "checkpoints" / "step-00000008"))


def test_a_failed_export_fails_the_run_by_name_and_leaves_nothing_beside_it(corpus, tmp_path: Path, monkeypatch):
    """The streamed export's write failing (DCP reports it as a BaseException) is the trainer's own error,
    naming the folder and the reason; its staging folder is removed and no model/ appears."""
    import errno

    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    def broken(self, plan, planner):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(HuggingFaceStorageWriter, "write_data", broken)
    cfg, packed = corpus
    run = tmp_path / "run"
    assert train(one_rank_spec(with_overrides(cfg, train={"steps": 4}), packed, run)) == 1
    error = status(run)["error"]
    assert error.startswith(f"exporting the model to {run}/.model.") and "rank 0: OSError: [Errno 5]" in error
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".model") or p.name == "model") == []


def test_a_checkpoint_of_another_model_is_refused_naming_the_tensors(corpus, tmp_path: Path):
    """Read from the checkpoint's index before any data: which tensors differ, and how."""
    cfg, packed = corpus
    run = tmp_path / "changed"
    assert train(one_rank_spec(with_overrides(cfg, train={"steps": 4}), packed, run)) == 0
    changed = with_overrides(cfg, train={"steps": 8}, model={"intermediate_size": 64})
    assert train(one_rank_spec(changed, packed, run)) == 1
    error = status(run)["error"]
    assert error.startswith(f"checkpoint {run / 'checkpoints' / 'step-00000004'} does not fit the configured model")
    assert "model.layers.0.mlp.gate_proj.weight is [96, 32] in the checkpoint, [64, 32] in this model" in error
    assert "(and 3 more)" in error and "Traceback" not in error


def test_checkpoint_of_an_older_format_is_refused_by_name(corpus, tmp_path: Path):
    cfg, packed = corpus
    run = tmp_path / "old"
    assert train(one_rank_spec(with_overrides(cfg, train={"steps": 4}), packed, run)) == 0
    folder = run / "checkpoints" / "step-00000004"
    meta = json.loads((folder / "meta.json").read_text())
    del meta["format"]
    (folder / "meta.json").write_text(json.dumps(meta))
    sums = json.loads((folder / "checksums.json").read_text())
    (folder / "checksums.json").write_text(json.dumps({**sums, "meta.json": sha256_file(folder / "meta.json")}))
    assert train(one_rank_spec(with_overrides(cfg, train={"steps": 8}), packed, run)) == 1
    error = status(run)["error"]
    assert str(folder / "meta.json") in error and "checkpoint format 1" in error
