"""What a refresh run does, decided once and written to its run folder so every later task reads the
same answer: the champion it continues, the landed batches its ledger does not hold, and the run's
config (the deployment's config continued from the champion on the refresh's own dataset)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pipelines import registry
from pipelines.config import DataConfig, RunConfig
from pipelines.errors import BadInput
from pipelines.refresh import landing, replay
from pipelines.refresh.landing import Batch
from pipelines.refresh.layout import layout
from pipelines.refresh.ledger import Ledger, Triage, of_version
from pipelines.run_folder import RunFolder

log = logging.getLogger("taxiway.refresh")


@dataclass(frozen=True)
class RefreshPlan:
    """``refresh/plan.json``, typed: what a refresh run trains on and why. Loaded once by whoever
    runs a stage of a refresh and handed to the stages that take its inputs (tokenize: the replay and
    the held-out new data; evaluate: the held-out new data; register: the ledger to extend)."""

    landing: str
    champion: str | None  # models:/NAME/VERSION this refresh continues; None: no champion
    ledger: tuple[dict[str, Any], ...]  # the champion's ledger rows (``ledger.Ledger.batches``)
    new: tuple[Batch, ...]
    resent: tuple[dict[str, Any], ...]  # a batch's fields plus ``repeats``: the trained id it repeats
    changed: tuple[Batch, ...]
    held: tuple[Batch, ...]
    quarantined: tuple[dict[str, Any], ...]  # a batch's fields plus ``attempts``: the failed runs
    invalid: tuple[dict[str, str], ...]  # {"folder", "reason"}
    base_data: dict[str, Any]  # the data section the champion's lineage started from
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"landing": self.landing, "champion": self.champion, "ledger": list(self.ledger),
                "new": [asdict(b) for b in self.new], "resent": list(self.resent),
                "changed": [asdict(b) for b in self.changed], "held": [asdict(b) for b in self.held],
                "quarantined": list(self.quarantined), "invalid": list(self.invalid),
                "base_data": self.base_data, "reason": self.reason}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> RefreshPlan:
        batches = {k: tuple(Batch(**b) for b in doc[k]) for k in ("new", "changed", "held")}
        rows = {k: tuple(doc[k]) for k in ("ledger", "resent", "quarantined", "invalid")}
        return cls(landing=doc["landing"], champion=doc["champion"], base_data=doc["base_data"], reason=doc["reason"],
                   **batches, **rows)

    @classmethod
    def load(cls, run_dir: Path) -> RefreshPlan:
        """The plan ``stages.refresh.plan`` wrote for this run."""
        return cls.from_json(json.loads(RunFolder(run_dir).refresh_plan.read_text()))

    @classmethod
    def of_run(cls, run_dir: Path) -> RefreshPlan | None:
        """The plan of a refresh run that trains; None for any other run."""
        if not RunFolder(run_dir).refresh_plan.exists():
            return None
        plan = cls.load(run_dir)
        return plan if plan.new else None

    @property
    def base(self) -> DataConfig:
        return DataConfig(**self.base_data)

    @property
    def parent_ledger(self) -> Ledger:
        """The champion's ledger, which this refresh's version extends."""
        return Ledger(self.ledger, self.base_data)

    def replay(self, cfg: RunConfig) -> replay.Replay | None:
        """The old data the train split mixes back in (``refresh.replay_fraction``); None at 0."""
        if cfg.refresh.replay_fraction == 0:
            return None
        groups, partial = replay.old_groups(self.base, self.landing, self.ledger)
        return replay.Replay(groups, partial, cfg.refresh.replay_fraction, cfg.train.seed)

    def fresh_data(self, cfg: RunConfig, run_dir: Path) -> RunConfig | None:
        """The held-out new data (``assemble`` placed it) as a config whose val split it is; None when
        every held-out document repeated trained data."""
        assembled = RunFolder(run_dir).refresh_assembled
        if not assembled.exists():
            raise BadInput(f"{assembled}: missing; run the refresh's 'assemble' step first")
        if not json.loads(assembled.read_text())["fresh_files"]:
            return None
        out = layout(cfg, run_dir)
        return cfg.model_copy(update={"data": cfg.data.model_copy(update={
            "val": str(out.fresh), "manifest": str(out.fresh_manifest)})})

    def parent_moved(self, moved: registry.ChampionMoved) -> str:
        """Why a refresh that passed against its parent stays ``challenger``: the alias left the parent."""
        now = f"models:/{moved.model_name}/{moved.found}" if moved.found else "no version"
        return (f"not promoted: this refresh continues {self.champion}, but {now} holds the champion alias now; "
                f"its batches stay new to the champion, whose next refresh trains on them")


@dataclass(frozen=True)
class Decision:
    """``config`` is the refresh run's config, or None when there is nothing to do (``reason`` says why)."""

    reason: str
    config: RunConfig | None


def new_since_champion(cfg: RunConfig, run_dir: Path) -> tuple[Triage, str | None, Ledger, list[tuple[str, str]]]:
    """The plan against the current champion's ledger (an empty one while there is no champion),
    the champion as ``models:/NAME/VERSION``, its ledger, and the landed batches that are invalid
    (folder, reason: a broken marker or manifest, or, for a new batch, a file the pipeline cannot
    read): those are reported and left out, never a reason to stop every refresh."""
    if not cfg.refresh.landing:
        raise BadInput("refresh.landing: not set; a refresh needs the landing zone of new batches")
    reg = cfg.registry
    batches, invalid = landing.scan(cfg.refresh.landing)
    c = registry.client()
    champion = registry.with_retries(reg, "read the champion",
                                     lambda: registry.current_champion(c, reg.model_name, reg.champion_alias))
    ledger = Ledger()
    if champion is not None:
        dest = RunFolder(run_dir).refresh_plan.parent / "champion-ledger"
        ledger = registry.with_retries(reg, "read the champion's ledger", lambda: of_version(c, champion, dest))
    uri = f"models:/{champion.name}/{champion.version}" if champion is not None else None
    triage = ledger.triage(batches)
    # the door's check, for batches another system landed: one the pipeline cannot read is invalid, never an attempt
    unread = {b.id: why for b in triage.new if (why := landing.unreadable_batch(b, cfg.data.format))}
    readable = replace(triage, new=[b for b in triage.new if b.id not in unread])
    return readable, uri, ledger, sorted(invalid + list(unread.items()))


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
    """The deployment's config, continued from ``champion`` (never from its ``pretrained`` start) for ``refresh.steps`` with a short
    re-warmup, on the dataset ``assemble`` builds in the run folder, judged against that parent
    version itself (not whatever holds the alias when it is evaluated). ``refresh.schedule`` shapes
    the LR from there (``launch.spec.lr_schedule``) around ``refresh.lr`` (else train.lr): rewarm decays
    over the whole refresh; wsd stays there and decays only the last ``refresh.decay_steps``, continuing the parent's stable state."""
    data, r, judged = layout(cfg, run_dir), cfg.refresh, judged_as_refresh(cfg, run_dir)
    return judged.model_copy(update={
        "parent": champion, "pretrained": None,  # the champion goes on, not the folder the first run started from
        "data": judged.data.model_copy(update={"train": str(data.train), "manifest": str(data.manifest)}),
        "train": cfg.train.model_copy(update={"steps": r.steps, "rewarmup_steps": r.warmup_steps,
                                              "lr": r.lr or cfg.train.lr}),
    })


def judged_as_refresh(cfg: RunConfig, run_dir: Path) -> RunConfig:
    """``cfg`` (the deployment's config) judged as a refresh in ``run_dir`` is: on the fixed validation set
    as the refresh dataset holds it, against the version it continues (``eval.baseline: parent``), not
    whatever holds the alias when it is evaluated; the owned fields a refresh sets itself."""
    return cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"baseline": "parent"}),
                                  "data": cfg.data.model_copy(update={"val": str(layout(cfg, run_dir).val)})})
