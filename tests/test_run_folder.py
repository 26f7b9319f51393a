"""The run folder's layout has one owner: ``pipelines/run_folder.py`` names every path, nothing else
joins run-folder paths by hand, and docs/architecture.md shows the module's own tree."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO
from pipelines import run_folder
from pipelines.run_folder import RunFolder


def _tree() -> str:
    doc = run_folder.__doc__ or ""
    block = doc[doc.index("    <run>/"):doc.index("Trainer states")].rstrip()
    return "\n".join(line[4:] for line in block.splitlines())


def test_architecture_page_shows_the_modules_tree():
    assert _tree() in (REPO / "docs" / "architecture.md").read_text()


def test_every_named_path_is_in_the_tree_and_inside_the_run_folder():
    folder = RunFolder(Path("/runs/r"))
    tree = _tree()
    named = {name: getattr(folder, name) for name, attr in vars(RunFolder).items() if isinstance(attr, property)}
    named.update(attempt_logs=folder.attempt_logs(1), preflight_check=folder.preflight_check("manifest"))
    for name, path in named.items():
        if not isinstance(path, Path):  # the trainer's paths, checked below
            continue
        assert path.is_relative_to(folder.root), name
        leaf = re.sub(r"-1$", "-N", path.name).replace("manifest.json", "<check>.json")
        assert leaf.removesuffix("/") in tree or f"{leaf}/" in tree, (name, leaf)
    for paths in (folder.trainer, folder.smoke_trainer):
        assert all(p.is_relative_to(folder.root) for p in vars(paths).values())
    assert RunFolder.of_gang(folder.gang) == folder


def test_nothing_else_joins_run_folder_paths():
    """The issue's check: ``grep -rn 'run_dir / "' pipelines plugins eval trainer`` finds only the module."""
    hits = [f"{path.relative_to(REPO)}:{n}" for top in ("pipelines", "plugins", "eval", "trainer")
            for path in (REPO / top).rglob("*.py") if path.name != "run_folder.py"
            for n, line in enumerate(path.read_text().splitlines(), 1) if 'run_dir / "' in line]
    assert not hits, hits
