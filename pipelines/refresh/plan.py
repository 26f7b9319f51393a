"""What is new since the champion: the landed batches its ledger does not hold, decided once per
refresh run and written to the run folder so every later task reads the same answer."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.refresh import landing
from pipelines.refresh.ledger import Ledger, Plan, of_version
from pipelines.run_folder import RunFolder
from trainer import fsio


def new_since_champion(cfg: RunConfig, run_dir: Path) -> tuple[Plan, str | None]:
    """The plan against the current champion's ledger (an empty one while there is no champion),
    and the champion as ``models:/NAME/VERSION``; written to ``refresh/plan.json``."""
    from pipelines.registry import client, current_champion, with_retries

    if not cfg.refresh.landing:
        raise BadInput("refresh.landing: not set; a refresh needs the landing zone of new batches")
    reg = cfg.registry
    batches = landing.complete_batches(cfg.refresh.landing)
    c = client()
    champion = with_retries(reg, "read the champion", lambda: current_champion(c, reg.model_name, reg.champion_alias))
    ledger = Ledger()
    if champion is not None:
        dest = RunFolder(run_dir).refresh_plan.parent / "champion-ledger"
        ledger = with_retries(reg, "read the champion's ledger", lambda: of_version(c, champion, dest))
    plan = ledger.plan(batches)
    uri = f"models:/{champion.name}/{champion.version}" if champion is not None else None
    fsio.write_json(RunFolder(run_dir).refresh_plan, {
        "landing": cfg.refresh.landing, "champion": uri, "ledger": list(ledger.batches),
        "new": [asdict(b) for b in plan.new], "resent": [{**asdict(b), "repeats": twin} for b, twin in plan.resent],
        "changed": [asdict(b) for b in plan.changed], "summary": plan.summary()})
    return plan, uri
