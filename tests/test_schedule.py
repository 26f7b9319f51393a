"""The LR schedule's two kinds (``refresh.schedule``): rewarm and warmup–stable–decay continued
across refreshes, as pure functions of the global step, and the trainer keeping the stable state."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from trainer_corpus import events, make_corpus, read_jsonl, with_overrides

from pipelines.config import RefreshConfig, TrainConfig
from pipelines.launch.spec import write_trainer_spec
from trainer import checkpoint
from trainer.loop import train
from trainer.schedule import Schedule
from trainer.spec import ScheduleSettings, TrainSettings, TrainSpec

WSD = ScheduleSettings("wsd", 10)


def _t(**over) -> TrainSettings:
    fields = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, "steps": 60, "decay": "linear", **over}
    return TrainSettings(**TrainConfig(**fields).model_dump())


def test_wsd_warms_up_stays_at_the_peak_and_decays_only_its_last_steps():
    fresh = Schedule.from_config(_t(), shape=WSD)
    assert fresh.lr(0) == pytest.approx(0.1) and fresh.lr(9) == pytest.approx(1.0)
    assert {fresh.lr(s) for s in range(9, 50)} == {1.0} and fresh.stable_step == 50
    assert fresh.lr(50) == pytest.approx(0.91) and fresh.lr(59) == pytest.approx(0.1)  # reaches min_lr at the end
    assert all(fresh.lr(s) > fresh.lr(s + 1) for s in range(49, 59))
    # a refresh continuing that stable state (global step 50, LR at the peak): no re-warmup to speak of
    child = Schedule.from_config(_t(steps=40, rewarmup_steps=5), origin_step=50, start_lr=fresh.lr(49), shape=WSD)
    assert {child.lr(s) for s in range(50, 80)} == {1.0} and child.stable_step == 80
    assert child.lr(89) == pytest.approx(0.1)
    # one continuing decayed weights (a champion trained before wsd) climbs back to the peak first
    boot = Schedule.from_config(_t(steps=40, rewarmup_steps=5), origin_step=60, start_lr=0.1, shape=WSD)
    assert boot.lr(60) == pytest.approx(0.28) and boot.lr(64) == pytest.approx(1.0) and boot.lr(89) == 1.0
    # rewarm on the same refresh decays from the end of the re-warmup over all the rest
    rewarm = Schedule.from_config(_t(steps=40, rewarmup_steps=5), origin_step=60, start_lr=0.1)
    assert rewarm.stable_step is None and rewarm.lr(64) == pytest.approx(1.0) and rewarm.lr(82) == pytest.approx(0.1 + 0.9 * 18 / 35)


@pytest.mark.parametrize("shape", [None, WSD], ids=["rewarm", "wsd"])
def test_resume_mid_decay_gives_the_same_lr_from_the_checkpoints_record(shape):
    """Resume rebuilds the schedule from the config and the anchor in meta.json: every LR is the same."""
    run = Schedule.from_config(_t(steps=40, rewarmup_steps=5), origin_step=60, start_lr=0.3, shape=shape)
    recorded = json.loads(json.dumps(run.to_dict()))  # as meta.json holds it
    again = Schedule.from_config(_t(steps=40, rewarmup_steps=5), recorded["origin_step"], recorded["start_lr"], shape)
    assert again == run == Schedule.from_dict(recorded)
    mid_decay = 95
    assert [again.lr(s) for s in range(mid_decay, 100)] == [run.lr(s) for s in range(mid_decay, 100)]
    assert run.lr(mid_decay) < run.lr(mid_decay - 1)
    # a checkpoint written before the schedule had kinds reads as rewarm
    old = {k: v for k, v in recorded.items() if k not in ("kind", "decay_steps")}
    assert Schedule.from_dict(old).kind == "rewarm"


def test_a_wsd_refresh_must_fit_its_warmup_and_decay():
    with pytest.raises(ValueError, match="exceed refresh.steps"):
        RefreshConfig(schedule="wsd", steps=30, warmup_steps=20, decay_steps=20)
    RefreshConfig(schedule="rewarm", steps=30, warmup_steps=20, decay_steps=20)


def test_a_refresh_trains_at_refresh_lr_else_train_lr(tmp_path: Path):
    """``refresh.lr`` is the peak (rewarm) or stable (wsd) LR of every refresh, never below train.min_lr."""
    from conftest import TINY
    from pipelines.config import load_config
    from pipelines.refresh.plan import refresh_config

    cfg = load_config(TINY)
    assert refresh_config(cfg, tmp_path, "models:/m/1").train.lr == cfg.train.lr
    lower = load_config(TINY, [f"refresh.lr={cfg.train.lr / 4}"])
    assert refresh_config(lower, tmp_path, "models:/m/1").train.lr == cfg.train.lr / 4
    with pytest.raises(Exception, match="refresh.lr .* is below train.min_lr"):
        load_config(TINY, [f"refresh.lr={cfg.train.min_lr / 2}"])


def test_pruning_keeps_the_pinned_stable_checkpoint(tmp_path: Path):
    root = tmp_path / "checkpoints"
    for step in (4, 8, 12, 16):
        checkpoint.step_dir(root, step).mkdir(parents=True)
    checkpoint._prune(root, 1, frozenset({8}))
    assert sorted(p.name for p in root.iterdir()) == ["step-00000008", "step-00000016"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    yield from make_corpus(tmp_path_factory)


def test_the_trainer_keeps_the_stable_state_and_a_child_continues_it_at_the_peak(corpus, tmp_path: Path):
    cfg, packed = corpus
    wsd = cfg.refresh.model_copy(update={"schedule": "wsd", "decay_steps": 4, "steps": 8, "warmup_steps": 2})
    parent_cfg = with_overrides(cfg, checkpoint={"keep_last_n": 1}).model_copy(
        update={"refresh": wsd, "parent": "models:/x/0"})
    parent_run = tmp_path / "parent"
    assert train(dataclasses.replace(TrainSpec.load(write_trainer_spec(parent_cfg, parent_run, packed)),
                                     world_size=1, parent=None)) == 0
    exported = json.loads((parent_run / "model" / "model.json").read_text())
    assert exported["stable_step"] == 12 and exported["final_lr"] == pytest.approx(cfg.train.min_lr)
    kept = sorted(p.name for p in (parent_run / "checkpoints").iterdir())
    assert kept == ["step-00000012", "step-00000016"]  # keep_last_n=1, and the stable state
    lrs = [r["lr"] for r in read_jsonl(parent_run / "metrics.jsonl")]
    assert lrs[11] == cfg.train.lr and lrs[12] < cfg.train.lr

    child_cfg = with_overrides(parent_cfg, train={"steps": 8, "rewarmup_steps": 2})
    child_run = tmp_path / "child"
    spec = TrainSpec.load(write_trainer_spec(child_cfg, child_run, packed, parent_weights=parent_run / "model",
                                             parent_checkpoint=parent_run / "checkpoints" / "step-00000012"))
    assert train(dataclasses.replace(spec, world_size=1)) == 0
    (loaded,) = events(child_run, "parent_loaded")
    assert loaded["global_step"] == 12 and loaded["start_lr"] == cfg.train.lr
    metrics = read_jsonl(child_run / "metrics.jsonl")
    assert [r["step"] for r in metrics][:1] == [13]
    assert {r["lr"] for r in metrics[:4]} == {cfg.train.lr} and metrics[-1]["lr"] == pytest.approx(cfg.train.min_lr)
    assert json.loads((child_run / "model" / "model.json").read_text())["stable_step"] == 16
