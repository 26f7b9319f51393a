"""The near-duplicate index of trained data is stored per source and extended, never rebuilt from
old documents."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from conftest import TINY
from pipelines import manifest
from pipelines.config import load_config
from pipelines.preflight.overlap import sign_files
from pipelines.refresh import landing, signatures
from pipelines.refresh.signatures import labelled, trained_index

WORDS = [f"w{i}" for i in range(5000)]


@pytest.fixture(autouse=True)
def own_cache(home: Path) -> Path:
    """Tests about what is stored use a cache of their own, not the session's shared one."""
    (home / "cache").unlink()
    (home / "cache").mkdir()
    return home / "cache"


def _doc(seed: int, n: int = 300) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "\n"


def _batch(root: Path, docs: dict[str, str]) -> Path:
    (root / "train").mkdir(parents=True)
    for name, text in docs.items():
        (root / "train" / name).write_text(text)
    return root


def test_trained_signatures_are_stored_once_and_find_a_resent_document(tmp_path: Path):
    cfg = load_config(TINY)
    zone = tmp_path / "landing"
    b1 = landing.land(_batch(tmp_path / "s1", {f"d{i}.txt": _doc(i) for i in range(6)}), zone, batch_id="b1")
    index, signed_now = trained_index(cfg, [("b1", b1.manifest, None)], workers=2)
    assert signed_now == 1 and len(index.ids) == 6 and signatures.path_of(cfg, b1.manifest_sha256).exists()

    shutil.rmtree(Path(b1.uri))  # stored signatures need no old document, nor its manifest
    again, signed_now = trained_index(cfg, [("b1", b1.manifest, b1.manifest_sha256)], workers=2)
    assert signed_now == 0 and again.ids == index.ids and again.ids[0].startswith("b1:train/")

    edited = _doc(3).replace("w1 ", "w2 ", 3)  # a re-sent document with a few words changed
    b2 = landing.land(_batch(tmp_path / "s2", {"resent.txt": edited, "fresh.txt": _doc(99)}), zone, batch_id="b2")
    root = manifest.root_of(b2.manifest)
    new = sign_files(cfg, [root.join(e.path) for e in manifest.read(b2.manifest)], root, workers=1)
    hits, _ = again.candidates(labelled(new, "b2"), cfg.preflight.overlap_jaccard - 0.1)
    assert [(t, v) for t, v, _ in hits] == [("b1:train/d3.txt", "b2:train/resent.txt")]
    assert new.sigs.shape == (2, cfg.preflight.num_perm)


def test_signatures_are_keyed_by_what_shapes_them(tmp_path: Path):
    """Other MinHash parameters or another document format sign again; the same ones reuse the file."""
    b1 = landing.land(_batch(tmp_path / "s1", {"d.txt": _doc(1)}), tmp_path / "landing", batch_id="b1")
    runs = [signatures.train_signatures(load_config(TINY, over), b1.manifest, workers=1)[1]
            for over in ([], [], ["preflight.num_perm=64"], ["data.format=txt"])]
    assert runs == [False, True, False, False]
