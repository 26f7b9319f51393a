"""What a refresh run does, decided once and written to its run folder so every later task reads the
same answer: the champion it continues, the landed batches its ledger does not hold, and the run's
config (the deployment's config continued from the champion on the refresh's own dataset)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from pipelines.config import RunConfig, load_config
from pipelines.errors import BadInput
from pipelines.refresh import attempts, landing
from pipelines.refresh.layout import layout
from pipelines.refresh.ledger import Ledger, Plan, of_version
from pipelines.run_folder import RunFolder
from trainer import fsio

log = logging.getLogger("taxiway.refresh")


@dataclass(frozen=True)
class Decision:
    """``config`` is the refresh run's config, or None when there is nothing to do (``reason`` says why)."""

    reason: str
    config: RunConfig | None


def new_since_champion(cfg: RunConfig, run_dir: Path) -> tuple[Plan, str | None, Ledger, list[tuple[str, str]]]:
    """The plan against the current champion's ledger (an empty one while there is no champion),
    the champion as ``models:/NAME/VERSION``, its ledger, and the landed batches that are invalid
    (folder, reason): those are reported and left out, never a reason to stop every refresh."""
    from pipelines.registry import client, current_champion, with_retries

    if not cfg.refresh.landing:
        raise BadInput("refresh.landing: not set; a refresh needs the landing zone of new batches")
    reg = cfg.registry
    batches, invalid = landing.scan(cfg.refresh.landing)
    c = client()
    champion = with_retries(reg, "read the champion", lambda: current_champion(c, reg.model_name, reg.champion_alias))
    ledger = Ledger()
    if champion is not None:
        dest = RunFolder(run_dir).refresh_plan.parent / "champion-ledger"
        ledger = with_retries(reg, "read the champion's ledger", lambda: of_version(c, champion, dest))
    uri = f"models:/{champion.name}/{champion.version}" if champion is not None else None
    return ledger.plan(batches), uri, ledger, invalid


def base_data(cfg: RunConfig, ledger: Ledger, champion: str | None) -> dict:
    """The corpus the champion's lineage started from (replayed and indexed as trained), as its
    ledger records it; the deployment's ``data`` section only for a lineage that recorded none."""
    if ledger.base is not None:
        return ledger.base
    if champion is not None:
        log.warning("%s records no base corpus (registered before Taxiway kept one): taking the config's "
                    "data section (%s) as what it was trained on", champion, cfg.data.manifest)
    return cfg.data.model_dump(mode="json")


def refresh_config(cfg: RunConfig, run_dir: Path, champion: str) -> RunConfig:
    """The deployment's config, continued from ``champion`` for ``refresh.steps`` with a short
    re-warmup, on the dataset ``assemble`` builds in the run folder, judged against that parent
    version itself (not whatever holds the alias when it is evaluated)."""
    data, r = layout(cfg, run_dir), cfg.refresh
    return cfg.model_copy(update={
        "parent": champion,
        "data": cfg.data.model_copy(update={"train": str(data.train), "val": str(data.val),
                                            "manifest": str(data.manifest)}),
        "train": cfg.train.model_copy(update={"steps": r.steps, "rewarmup_steps": r.warmup_steps}),
        "eval": cfg.eval.model_copy(update={"baseline": "parent"}),
    })


def decide(cfg: RunConfig, run_dir: Path, run_key: str) -> Decision:
    """Plan this refresh and write ``refresh/plan.json``, once per run: a retry (or a clear) of the
    plan task returns the decision already made, so the run's data never changes under its
    checkpoints. Batches past ``refresh.max_attempts`` failed refreshes are quarantined, batches that
    failed before wait while new ones go first (``attempts``); invalid batches are reported."""
    folder = RunFolder(run_dir)
    if folder.refresh_plan.exists():
        made = read(run_dir)
        if not made["new"]:
            return Decision(made["reason"], None)
        return Decision(made["reason"], load_config(folder.config) if folder.config.exists()
                        else refresh_config(cfg, run_dir, made["champion"]))
    plan, champion, ledger, invalid = new_since_champion(cfg, run_dir)
    known = attempts.repeats(plan.new, champion) if champion else {}
    fresh = [b for b in plan.new if b.id not in known]
    taken = attempts.take(fresh, run_key, champion, cfg.refresh.max_attempts) if champion else attempts.Taken(fresh)
    notes = [plan.summary()] + [f"{name} invalid: {why}" for name, why in invalid] + [
        f"{bid} dropped: {why}" for bid, why in known.items()] + [
        f"{b.id} quarantined: it took part in {len(runs)} failed refresh(es) ({', '.join(runs)}), "
        f"refresh.max_attempts is {cfg.refresh.max_attempts}; fix it and land it under a new id"
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
    fsio.write_json(folder.refresh_plan, {
        "landing": cfg.refresh.landing, "champion": champion, "ledger": list(ledger.batches),
        "new": [asdict(b) for b in new], "resent": [{**asdict(b), "repeats": twin} for b, twin in plan.resent],
        "changed": [asdict(b) for b in plan.changed], "held": [asdict(b) for b in taken.held],
        "quarantined": [{**asdict(b), "attempts": runs} for b, runs in taken.quarantined],
        "invalid": [{"folder": name, "reason": why} for name, why in invalid],
        "base_data": base_data(cfg, ledger, champion), "reason": reason})
    return Decision(reason, run_cfg)


def read(run_dir: Path) -> dict:
    """``refresh/plan.json`` as ``decide`` wrote it."""
    return json.loads(RunFolder(run_dir).refresh_plan.read_text())


def of_run(run_dir: Path) -> dict | None:
    """The plan of a refresh run that trains (None for any other run)."""
    path = RunFolder(run_dir).refresh_plan
    if not path.exists():
        return None
    plan = json.loads(path.read_text())
    return plan if plan["new"] else None


def parent_moved(plan: dict, moved) -> str:
    """Why a refresh that passed against its parent stays ``challenger``: the alias left the parent."""
    now = f"models:/{moved.model_name}/{moved.found}" if moved.found else "no version"
    return (f"not promoted: this refresh continues {plan['champion']}, but {now} holds the champion alias now; "
            f"its batches stay new to the champion, whose next refresh trains on them")


def batches(plan: dict) -> list[landing.Batch]:
    return [landing.Batch(**b) for b in plan["new"]]
