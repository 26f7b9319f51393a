"""The registered model a run continues (``parent``): its weights, its tokenizer and, where it can
still be found, its full checkpoint. Shared by tokenize (the parent's vocabulary) and train."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipelines import registry
from pipelines.config import RunConfig
from pipelines.errors import BadInput
from pipelines.run_folder import RunFolder
from pipelines.stages import pretrained
from pipelines.stages.prepare import require
from trainer import fsio

log = logging.getLogger("taxiway.stages")


def tokenizer(cfg: RunConfig, parent_dir: Path) -> Path:
    """The parent's (or pretrained folder's) tokenizer; an explicit ``tokenizer.path`` that differs from it
    is refused."""
    theirs = require(parent_dir / "tokenizer.json", "register (the parent has no tokenizer.json)")
    if cfg.tokenizer.path and fsio.sha256_file(cfg.tokenizer.path) != fsio.sha256_file(theirs):
        raise BadInput(f"tokenizer.path {cfg.tokenizer.path} differs from the parent model's tokenizer "
                       f"({cfg.parent}, sha256 {fsio.sha256_file(theirs)[:12]}…): continued training must keep "
                       "the parent's vocabulary; unset tokenizer.path")
    return theirs


def weights(cfg: RunConfig, run_dir: Path) -> Path | None:
    """The weights a run starts from: the parent's exported folder (downloaded into the run folder), the
    pretrained folder (fetched and checked when the run was prepared), or None for a run from scratch."""
    if cfg.pretrained:
        return pretrained.folder(cfg, run_dir)
    if not cfg.parent:
        return None
    return registry.download(registry.resolve_version(cfg.parent), RunFolder(run_dir).parent)


def checkpoint(cfg: RunConfig, weights_dir: Path) -> Path | None:
    """The parent's full checkpoint (optimizer state too) to continue. With ``refresh.schedule: wsd``
    first its stable (pre-decay) state, which the parent's own run folder keeps (``stable_step`` in its
    model.json): the main trajectory goes on at the stable LR, and the decayed weights stay the released
    model. Else (or when that is gone) the step its weights were exported from: from the run folder it
    was trained in (its version's ``taxiway.run_dir``) while that still holds it, else the copy logged
    with the version (``registry.log_checkpoint``); else None, and training continues from the weights
    alone. Either way it is logged."""
    from trainer import checkpoint as ckpt  # torch (~1 s): DAG files import this module's importers

    mv = registry.resolve_version(cfg.parent, cfg.registry)
    tags = mv.tags or {}
    origin = tags.get("taxiway.run_dir")
    info = json.loads((weights_dir / "model.json").read_text())
    exported, stable = info.get("global_step"), info.get("stable_step")

    def made_this_version(path: Path | None, step: int | None) -> bool:
        meta = json.loads((path / "meta.json").read_text()) if path is not None else {}
        return (meta.get("global_step") == step and meta.get("format") == ckpt.FORMAT
                and meta.get("config_sha256") == tags.get("taxiway.config_sha256"))

    def in_run_folder(step: object) -> Path | None:
        return ckpt.at_step(RunFolder(Path(origin)).checkpoints, step) if origin and isinstance(step, int) else None

    if cfg.refresh.schedule == "wsd":
        if made_this_version(path := in_run_folder(stable), stable):
            log.info("continuing %s from its stable (pre-decay) state at step %s (refresh.schedule: wsd): %s",
                     cfg.parent, stable, path)
            return path
        log.warning("refresh.schedule is wsd but %s has no stable (pre-decay) checkpoint in its run folder (%s; "
                    "stable step %s): continuing its released weights, re-warmed to train.lr", cfg.parent,
                    origin or "none recorded", stable if stable is not None else "none: not trained with wsd")
    sources = (("its run folder", lambda: in_run_folder(exported)),
               ("the checkpoint logged with it", lambda: registry.download_checkpoint(
                   mv, weights_dir.with_name(f"{weights_dir.name}-checkpoint"), cfg.registry)))
    for where, find in sources:
        if made_this_version(path := find(), exported):
            log.info("continuing %s from its full checkpoint (weights and optimizer state), from %s: %s",
                     cfg.parent, where, path)
            return path
    log.info("continuing %s from its weights only (optimizer state starts fresh): no valid checkpoint of step %s "
             "in its run folder (%s) nor logged with it", cfg.parent, exported, origin or "none recorded")
    return None
