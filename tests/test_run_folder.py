"""The run folder's layout has one owner: ``pipelines/run_folder.py`` names every path, nothing else
joins run-folder paths by hand, and docs/architecture.md shows the module's own tree."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

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


# Airflow's run ids are free text (a REST trigger names its own); DAG ids are ``[\w.-]+``
_RUN_IDS = st.one_of(st.text(alphabet="x1:_+ ./é", max_size=6), st.text(max_size=300))
_DAG_IDS = st.one_of(st.sampled_from(["taxiway_train", "taxiway_sweep", "a.b", "a_b", ".."]),
                     st.from_regex(r"[\w.-]{1,250}", fullmatch=True))


def test_runs_that_read_alike_or_share_a_run_id_get_folders_of_their_own(tmp_path: Path):
    """The local gang and its cancel are keyed by the run folder: ``x:1`` and ``x_1`` (the same once
    made safe), or one run id in two DAGs, sharing one let a run stop another's gang."""
    folders = {run_folder.run_dir(d, r, tmp_path) for d, r in
               [("taxiway_train", "x:1"), ("taxiway_train", "x_1"), ("taxiway_sweep", "x:1"), ("taxiway_train", "x 1")]}
    assert len(folders) == 4, folders
    one = run_folder.run_dir("taxiway_train", "manual__2026-12-01T10:00:00+00:00", tmp_path)
    assert one.parent == tmp_path / "runs" / "taxiway_train", one  # readable: the DAG, then the run id
    assert one.name.startswith("manual__2026-12-01T10_00_00_00_00-"), one


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_DAG_IDS, _RUN_IDS), unique=True, max_size=40))
def test_a_run_folder_is_one_to_one_in_dag_and_run_id_and_a_safe_path(pairs: list[tuple[str, str]]):
    home = Path("/home")
    folders = [run_folder.run_dir(d, r, home) for d, r in pairs]
    assert len(set(folders)) == len(pairs)
    for (dag_id, run_id), folder in zip(pairs, folders, strict=True):
        assert folder == run_folder.run_dir(dag_id, run_id, home)  # every task and the view compute the same
        parts = folder.relative_to(home / "runs").parts
        assert len(parts) == 2 and all(re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,120}", p) for p in parts), parts


def test_every_run_folder_is_listed_the_clis_and_airflows(tmp_path: Path):
    """``taxiway summary`` finds the newest registered run among both kinds."""
    made = [run_folder.named_run_dir("tiny-0123456789ab", tmp_path), run_folder.run_dir("taxiway_train", "r:1", tmp_path)]
    for folder in made:
        RunFolder(folder).config.parent.mkdir(parents=True)
        RunFolder(folder).config.write_text("name: tiny\n")
    assert sorted(f.root for f in run_folder.run_folders(tmp_path)) == sorted(made)
