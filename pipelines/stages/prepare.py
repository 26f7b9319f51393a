"""Before any stage: the run folder's ``config.yaml`` (the run's identity), and what every stage
uses to read it and to find an earlier stage's output."""

from __future__ import annotations

from pathlib import Path

from pipelines.config import RunConfig, load_config
from pipelines.errors import BadInput
from pipelines.run_folder import RunFolder
from trainer import fsio


class StageInputError(BadInput):
    """An earlier stage's output is missing: the stages ran out of order."""


def prepare(cfg: RunConfig, run_dir: Path) -> Path:
    """Write ``config.yaml`` and its sha256: the run's identity; fetch and check the pretrained folder a
    run starts from, before any compute. Idempotent for the same config."""
    from pipelines.stages import pretrained  # it imports this module's neighbours; prepare is the first step
    run_dir.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(run_dir)
    path = folder.config
    if path.exists() and path.read_text() != cfg.to_yaml():
        raise BadInput(f"{run_dir}: run folder already holds a different config; use another --run-dir")
    fsio.write_text(path, cfg.to_yaml())
    fsio.write_text(folder.config_sha256, cfg.sha256() + "\n")
    pretrained.fetch(cfg, run_dir)
    return path


def load_run_config(run_dir: Path) -> RunConfig:
    path = RunFolder(run_dir).config
    if not path.exists():
        raise StageInputError(f"{path}: missing; the run folder was not prepared")
    return load_config(path, expand=False)  # written resolved: a trigger's ${VAR} in it stays text


def require(path: Path, stage: str) -> Path:
    """``path``, which the stage ``stage`` writes; refused, naming that stage, while it is missing."""
    if not path.exists():
        raise StageInputError(f"{path}: missing; run the '{stage}' stage first")
    return path
