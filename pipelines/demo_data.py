"""A demo corpus that every machine already has: the interpreter's standard-library sources.

Real text, nothing downloaded, deterministic for a seed on a given interpreter.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import sysconfig
from pathlib import Path

from pipelines import manifest
from pipelines.errors import BadInput
from trainer import fsio

# Folders of generated or near-identical files (codec tables, test fixtures) that would make
# train and val overlap by construction.
_EXCLUDED = {"test", "tests", "encodings", "idlelib", "lib2to3", "site-packages", "__pycache__"}


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        if _EXCLUDED & set(path.relative_to(root).parts[:-1]):
            continue
        try:
            text = path.read_bytes()
            text.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            files.append(path)
    return files


def write_demo_data(out_dir: str | Path, seed: int = 0, val_fraction: float = 0.1,
                    max_files: int | None = None, force: bool = False) -> Path:
    """Write ``train/``, ``val/`` and ``manifest.jsonl`` under ``out_dir``; return the manifest path.

    Exact duplicates are dropped before the split so val never repeats train by construction.
    """
    out = Path(out_dir).resolve()
    if out.exists() and any(out.iterdir()) and not force:
        raise BadInput(f"{out}: exists and is not empty (pass --force to replace it)")
    root = Path(sysconfig.get_paths()["stdlib"])
    seen, unique = set(), []
    for path in stdlib_sources():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            unique.append(path)
    random.Random(seed).shuffle(unique)
    if max_files:
        unique = unique[:max_files]
    n_val = max(1, round(len(unique) * val_fraction))
    splits = {"val": unique[:n_val], "train": unique[n_val:]}
    staging = out.parent / f"{out.name}.new"
    shutil.rmtree(staging, ignore_errors=True)
    with fsio.staged_dir(staging) as stage:
        entries = []
        for split in manifest.SPLITS:
            folder = stage / split
            folder.mkdir()
            for src in sorted(splits[split]):
                name = "__".join(src.relative_to(root).with_suffix(".txt").parts)
                shutil.copyfile(src, folder / name)
                entries.append(manifest.entry_for(stage, folder / name, split))
        manifest.write(stage / "manifest.jsonl", entries)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out / "manifest.jsonl"
