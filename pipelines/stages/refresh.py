"""A refresh's own steps before the common stages (docs/refresh.md): ``plan`` decides once per run
which champion it continues and which landed batches are new to it (``refresh/plan.json``, read
back as a ``RefreshPlan``); ``assemble`` builds its dataset from them. The plan is then handed to
tokenize, evaluate and register, which take its inputs."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from pipelines.config import RunConfig, load_config
from pipelines.refresh import assemble as assembling
from pipelines.refresh import attempts
from pipelines.refresh.assemble import NothingNew
from pipelines.refresh.plan import Decision, RefreshPlan, base_data, new_since_champion, refresh_config
from pipelines.run_folder import RunFolder
from pipelines.stages.prepare import load_run_config
from trainer import fsio

__all__ = ["NothingNew", "assemble", "plan"]


def plan(cfg: RunConfig, run_dir: Path, run_key: str, counts: bool = True) -> Decision:
    """Plan this refresh (the deployment's config ``cfg`` continued from the champion on the batches
    new to it, or nothing to do and why) and write ``refresh/plan.json``, once per run: a retry (or a clear) of the
    plan task returns the decision already made, so the run's data never changes under its
    checkpoints. Batches past ``refresh.max_attempts`` failed refreshes are quarantined, batches that
    failed before wait while new ones go first (``attempts``); invalid batches are reported. ``counts``:
    whether this run's failure would count against its batches (not for a run a trigger shaped)."""
    folder = RunFolder(run_dir)
    if folder.refresh_plan.exists():
        made = RefreshPlan.load(run_dir)
        if not made.new:
            return Decision(made.reason, None)
        return Decision(made.reason, load_config(folder.config) if folder.config.exists()
                        else refresh_config(cfg, run_dir, made.champion))
    triage, champion, ledger, invalid = new_since_champion(cfg, run_dir)
    known = attempts.repeats(triage.new, champion) if champion else {}
    fresh = [b for b in triage.new if b.id not in known]
    taken = (attempts.take(fresh, run_key, champion, cfg.refresh.max_attempts, record=counts) if champion
             else attempts.Taken(fresh))
    notes = [triage.summary()] + [f"{name} invalid: {why}" for name, why in invalid] + [
        f"{bid} dropped: {why}" for bid, why in known.items()] + [
        f"{b.id} quarantined: it took part in {len(runs)} failed refresh(es) ({', '.join(runs)}), "
        f"refresh.max_attempts is {cfg.refresh.max_attempts}; fix it and land it under a new id, or release it "
        "on the batches page (/taxiway/batches) to try it again"
        for b, runs in taken.quarantined] + [
        f"{b.id} held back: it failed before, and is tried alone after the batches that did not" for b in taken.held]
    new = taken.kept
    if champion is None:
        reason = (f"nothing to refresh: no version of {cfg.registry.model_name} holds "
                  f"'{cfg.registry.champion_alias}'; train one with taxiway_train first")
    elif not new:
        reason = f"nothing new since the champion {champion}: " + "; ".join(notes)
    else:
        reason = f"refreshing {champion} on {', '.join(b.id for b in new)}: " + "; ".join(notes)
    run_cfg = refresh_config(cfg, run_dir, champion) if champion and new else None
    made = RefreshPlan(
        landing=cfg.refresh.landing, champion=champion, ledger=tuple(ledger.batches), new=tuple(new),
        resent=tuple({**asdict(b), "repeats": twin} for b, twin in triage.resent), changed=tuple(triage.changed),
        held=tuple(taken.held), quarantined=tuple({**asdict(b), "attempts": runs} for b, runs in taken.quarantined),
        invalid=tuple({"folder": name, "reason": why} for name, why in invalid),
        base_data=base_data(cfg, ledger, champion), reason=reason)
    fsio.write_json(folder.refresh_plan, made.to_json())
    return Decision(reason, run_cfg)


def assemble(run_dir: Path) -> dict:
    """The refresh's dataset for its plan's new batches (``NothingNew`` when every new document
    repeats trained data); returns ``assembled.json``."""
    return assembling.assemble(load_run_config(run_dir), run_dir, RefreshPlan.load(run_dir))
