"""New data for refresh tests: small standard-library sources the demo corpus lacks, as batch
sources (``train/``), and a registered champion to refresh."""

from __future__ import annotations

import shutil
from pathlib import Path

from trained_models import make_run

CHAMPION_STEPS = 150


def new_files(demo_data: Path, skip: int, count: int) -> list[Path]:
    from pipelines import manifest
    from pipelines.demo_data import stdlib_sources
    from trainer.fsio import sha256_file

    known = {e.sha256 for e in manifest.read(demo_data / "manifest.jsonl")}
    fresh = [p for p in stdlib_sources() if 2_000 < p.stat().st_size < 12_000 and sha256_file(p) not in known]
    return fresh[skip:skip + count]


def source(root: Path, files: list[Path]) -> Path:
    """A folder to land: ``train/fNNN.py.txt`` copies of ``files``."""
    (root / "train").mkdir(parents=True)
    for i, path in enumerate(files):
        shutil.copyfile(path, root / "train" / f"f{i:03d}.py.txt")
    return root


def register_champion(home: Path, trained: Path | None = None) -> str:
    """A new champion of the tiny model in the registry of ``$TAXIWAY_HOME`` (= ``home``), as
    ``models:/NAME/VERSION``: ``trained`` (a ``make_run`` folder, copied) or one trained here."""
    from pipelines import stages

    run_dir = home / "runs" / "base"
    if trained is None:
        make_run(home, "base", CHAMPION_STEPS, preflight=True)
    else:
        shutil.copytree(trained, run_dir, symlinks=True)
    cfg = stages.prepare.load_run_config(run_dir)
    assert stages.evaluate.run(cfg, run_dir)["passed"]
    registered = stages.register.run(cfg, run_dir, "base")
    assert registered["alias"] == "champion", registered
    return registered["uri"]
