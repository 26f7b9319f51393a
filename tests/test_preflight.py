"""Preflight: every bad input is named with its reason and never yields a passed report;
overlap and duplicates are found; decontamination goes on without them; fsspec URIs work."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from conftest import TINY
from pipelines import manifest
from pipelines.config import load_config
from pipelines.documents import DocumentError
from pipelines.manifest import ManifestError
from pipelines.preflight.report import CHECK_NAMES
from pipelines.stages import preflight
from pipelines.storage import StorageError

WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon phi chi psi omega").split()


def _doc(i: int, n: int = 60) -> str:
    """Distinct documents: a different word order per i, so none overlap by accident."""
    import random

    rng = random.Random(i)
    return " ".join(rng.choice(WORDS) + str(rng.randrange(1000)) for _ in range(n)) + "\n"


def _corpus(root: Path, train: int = 20, val: int = 6) -> Path:
    for split, n, offset in (("train", train, 0), ("val", val, 1000)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            (root / split / f"d{i:03d}.txt").write_text(_doc(offset + i))
    manifest.write(root / "manifest.jsonl", manifest.scan(root))
    return root


def _cfg(root: Path, *extra: str, manifest_path: str | None = None):
    return load_config(TINY, [f"data.train={root / 'train'}", f"data.val={root / 'val'}",
                              f"data.manifest={manifest_path or root / 'manifest.jsonl'}",
                              "preflight.workers=1", *extra])


@pytest.fixture()
def data(tmp_path: Path) -> Path:
    return _corpus(tmp_path / "data")


def _failed(report, check: str, *needles: str) -> str:
    assert not report.passed
    result = report.checks[check]
    assert not result.passed, report.summary()
    for needle in needles:
        assert needle in result.message, result.message
    return result.message


def test_clean_corpus_passes(data: Path, tmp_path: Path):
    report = preflight.run(_cfg(data), tmp_path / "run")
    assert report.passed, report.summary()
    saved = json.loads((tmp_path / "run" / "preflight" / "report.json").read_text())
    assert saved["passed"] and saved["schema_version"] == 1
    assert set(saved["checks"]) == {"manifest", "documents", "duplicates", "overlap"}
    assert saved["checks"]["documents"]["details"]["great_expectations"]["success"] is True
    assert (tmp_path / "run" / "preflight" / "overlap.png").stat().st_size > 1000
    assert "Preflight: PASSED" in (tmp_path / "run" / "preflight" / "report.md").read_text()


# --- bad input, one test each -------------------------------------------------------------

def test_missing_file(data: Path, tmp_path: Path):
    (data / "train" / "d003.txt").unlink()
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "manifest", "train/d003.txt", "missing")


def test_unlisted_file(data: Path, tmp_path: Path):
    (data / "train" / "extra.txt").write_text(_doc(77))
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "manifest", "extra.txt", "not in the manifest")
    assert preflight.run(_cfg(data, "preflight.allow_unlisted=true"), tmp_path / "run2").checks["manifest"].passed


def test_size_mismatch(data: Path, tmp_path: Path):
    (data / "val" / "d002.txt").write_text(_doc(1002) + "more\n")
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "manifest", "val/d002.txt", "size")


def test_hash_mismatch(data: Path, tmp_path: Path):
    path = data / "val" / "d002.txt"
    text = path.read_text()
    path.write_text(text[:-2] + ("X" if text[-2] != "X" else "Y") + "\n")   # same size, other bytes
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "manifest", "val/d002.txt", "sha256")


def _relist(data: Path) -> None:
    manifest.write(data / "manifest.jsonl", manifest.scan(data))


def test_empty_file(data: Path, tmp_path: Path):
    (data / "train" / "d004.txt").write_text("")
    _relist(data)
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/d004.txt", "n_chars")


def test_invalid_utf8(data: Path, tmp_path: Path):
    (data / "train" / "d005.txt").write_bytes(b"caf\xe9 au lait " * 10)
    _relist(data)
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/d005.txt", "invalid UTF-8")


def test_binary_file(data: Path, tmp_path: Path):
    (data / "train" / "d006.txt").write_bytes(bytes(range(256)) * 4)
    _relist(data)
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/d006.txt", "binary")


def _jsonl_corpus(root: Path, bad_line: str) -> Path:
    for split, n, offset in (("train", 3, 0), ("val", 1, 1000)):
        (root / split).mkdir(parents=True)
        lines = [json.dumps({"text": _doc(offset + 10 * k + i)}) for k in range(n) for i in range(5)]
        if split == "train":
            lines[2] = bad_line
        (root / split / "part.jsonl").write_text("\n".join(lines) + "\n")
    _relist(root)
    return root


def test_jsonl_line_not_json(tmp_path: Path):
    data = _jsonl_corpus(tmp_path / "data", '{"text": "unterminated')
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/part.jsonl#3", "not valid JSON")


def test_jsonl_line_without_text(tmp_path: Path):
    data = _jsonl_corpus(tmp_path / "data", json.dumps({"body": "no text field"}))
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/part.jsonl#3", "no string field 'text'")


def test_parquet_without_text(tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split).mkdir(parents=True)
        column = "body" if split == "train" else "text"
        pq.write_table(pa.table({column: [_doc(i) for i in range(5)]}), data / split / "part.parquet")
    _relist(data)
    _failed(preflight.run(_cfg(data), tmp_path / "run"), "documents", "train/part.parquet", "no column 'text'")


@pytest.mark.parametrize("bad_path", ["../outside.txt", "/etc/passwd", "train/../../x.txt"])
def test_manifest_path_escaping_the_root(data: Path, tmp_path: Path, bad_path: str):
    lines = (data / "manifest.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    row["path"] = bad_path
    lines[0] = json.dumps(row)
    (data / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ManifestError, match=r"manifest.jsonl:1: .*escapes the data root"):
        preflight.run(_cfg(data), tmp_path / "run")
    assert not (tmp_path / "run" / "preflight" / "report.json").exists()


def test_symlink_loop(data: Path, tmp_path: Path):
    os.symlink(data / "train" / "loop", data / "train" / "loop")
    with pytest.raises(StorageError, match=r"train/loop: broken or looping symlink"):
        preflight.run(_cfg(data), tmp_path / "run")
    assert not (tmp_path / "run" / "preflight" / "report.json").exists()


def test_empty_val_split(data: Path, tmp_path: Path):
    for f in (data / "val").iterdir():
        f.unlink()
    _relist(data)
    report = preflight.run(_cfg(data), tmp_path / "run")
    _failed(report, "manifest", "split 'val' lists no files")
    _failed(report, "documents", "split(s) with no documents: ['val']")


def test_malformed_manifest_line(data: Path, tmp_path: Path):
    with open(data / "manifest.jsonl", "a") as fh:
        fh.write('{"path": "train/d000.txt", "split": "train", "bytes": "12"}\n')
    with pytest.raises(ManifestError, match=r"manifest.jsonl:27: missing field\(s\) sha256"):
        preflight.run(_cfg(data), tmp_path / "run")


def test_unknown_extension_is_bad_input(data: Path, tmp_path: Path):
    (data / "train" / "notes.docx").write_bytes(b"PK\x03\x04")
    _relist(data)
    with pytest.raises(DocumentError, match=r"notes.docx: cannot infer format"):
        preflight.run(_cfg(data), tmp_path / "run")


# --- what the gate is for ------------------------------------------------------------------

def _plant(data: Path, mutate_every: int, name: str) -> None:
    """A val document made from a train document with every ``mutate_every``-th word changed."""
    words = (data / "train" / "d007.txt").read_text().split()
    for i in range(0, len(words), mutate_every):
        words[i] = "mutated" + str(i)
    (data / "val" / name).write_text(" ".join(words) + "\n")


def test_near_duplicate_is_found_and_fails_the_gate(data: Path, tmp_path: Path):
    _plant(data, 60, "near.txt")      # one word of 60 changed: Jaccard about 0.9
    _relist(data)
    report = preflight.run(_cfg(data), tmp_path / "run")
    _failed(report, "overlap", "1/7 val documents")
    pair = report.overlap["pairs"][0]
    assert pair["val"] == "val/near.txt" and pair["train"] == "train/d007.txt" and pair["jaccard"] >= 0.8


def test_overlap_is_the_same_on_two_worker_processes(data: Path, monkeypatch: pytest.MonkeyPatch):
    """The parallel path (forked workers, results indexed as they arrive) finds what one worker finds."""
    from pipelines.preflight import overlap
    from pipelines.preflight.overlap import check_overlap

    monkeypatch.setattr(overlap, "BATCH_BYTES", 4000)  # many batches per split
    _plant(data, 60, "near.txt")
    _plant(data, 30, "nearer.txt")
    _relist(data)
    one, two = (check_overlap(_cfg(data), workers=w) for w in (1, 2))
    assert one.details["pairs"] and one.details == two.details


def test_exact_duplicates_within_and_across(data: Path, tmp_path: Path):
    shutil.copyfile(data / "train" / "d001.txt", data / "train" / "copy.txt")
    (data / "val" / "leak.txt").write_text("  " + (data / "train" / "d002.txt").read_text().upper())
    _relist(data)
    report = preflight.run(_cfg(data, "preflight.max_duplicate_fraction=0.0"), tmp_path / "run")
    details = report.checks["duplicates"].details
    assert details["within"]["train"] == [{"doc": "train/d001.txt", "duplicate_of": "train/copy.txt"}]
    assert details["across"] == [{"val": "val/leak.txt", "train": "train/d002.txt"}]
    _failed(report, "duplicates", "val copies of train 1")


def test_decontaminate_drops_and_goes_on(data: Path, tmp_path: Path):
    _plant(data, 60, "near.txt")
    _relist(data)
    run_dir = tmp_path / "run"
    cfg = _cfg(data, "preflight.action=decontaminate")
    report = preflight.run(cfg, run_dir)
    assert report.passed, report.summary()
    assert report.decontamination["dropped"] == ["val/near.txt"]
    clean = run_dir / "preflight" / "clean"
    assert not (clean / "val" / "near.txt").exists() and (clean / "val" / "d000.txt").exists()
    entries = manifest.read(clean / "manifest.jsonl")
    assert {e.path for e in entries if e.split == "val"} == {f"val/d{i:03d}.txt" for i in range(6)}
    assert (clean / "train" / "d007.txt").read_text() == (data / "train" / "d007.txt").read_text()
    from pipelines.preflight.decontaminate import effective_data

    eff = effective_data(cfg, run_dir)
    assert eff.data.val == str(clean / "val") and eff.data.manifest == str(clean / "manifest.jsonl")


# --- fsspec --------------------------------------------------------------------------------

def test_manifest_on_file_uri(data: Path, tmp_path: Path):
    entries = manifest.scan(f"file://{data}")
    assert [e.path for e in entries] == [e.path for e in manifest.read(data / "manifest.jsonl")]
    report = preflight.run(load_config(TINY, [f"data.train=file://{data / 'train'}", f"data.val=file://{data / 'val'}",
                                              f"data.manifest=file://{data / 'manifest.jsonl'}",
                                              "preflight.workers=1"]), tmp_path / "run")
    assert report.passed, report.summary()


def test_manifest_on_memory_filesystem(data: Path, tmp_path: Path):
    import fsspec

    mem = fsspec.filesystem("memory")
    for split in ("train", "val"):
        for f in (data / split).iterdir():
            mem.pipe_file(f"/corpus/{split}/{f.name}", f.read_bytes())
    written = manifest.write("memory://corpus/manifest.jsonl", manifest.scan("memory://corpus"))
    assert written == "memory://corpus/manifest.jsonl"
    cfg = load_config(TINY, ["data.train=memory://corpus/train", "data.val=memory://corpus/val",
                             "data.manifest=memory://corpus/manifest.jsonl"])
    report = preflight.run(cfg, tmp_path / "run")
    assert report.passed, report.summary()
    mem.pipe_file("/corpus/val/d001.txt", b"changed")
    _failed(preflight.run(cfg, tmp_path / "run2"), "manifest", "val/d001.txt")
    mem.rm("/corpus", recursive=True)


def test_decontaminate_drops_every_val_copy_of_a_train_document(data: Path, tmp_path: Path):
    for name in ("copy1.txt", "copy2.txt"):  # the second copy is also a within-val duplicate of the first
        shutil.copyfile(data / "train" / "d003.txt", data / "val" / name)
    _relist(data)
    report = preflight.run(_cfg(data, "preflight.action=decontaminate"), tmp_path / "run")
    assert report.passed, report.summary()
    assert {"val/copy1.txt", "val/copy2.txt"} <= set(report.decontamination["dropped"])
    clean_val = {p.name for p in (tmp_path / "run" / "preflight" / "clean" / "val").iterdir()}
    assert not {"copy1.txt", "copy2.txt"} & clean_val


def test_the_index_finds_exactly_what_datasketchs_minhashlsh_finds():
    """Train signatures with planted near copies among val ones: every val document's candidates from
    ``TrainIndex`` equal ``MinHashLSH.query`` over the same signatures (same bands, same buckets)."""
    import numpy as np
    from datasketch import LeanMinHash, MinHashLSH

    from pipelines.config import load_config
    from pipelines.preflight.overlap import Signed, TrainIndex

    rng = np.random.default_rng(1)
    train = rng.integers(0, 2**32, (400, 128), dtype=np.uint64).astype(np.uint32)
    val = rng.integers(0, 2**32, (60, 128), dtype=np.uint64).astype(np.uint32)
    for j in range(40):  # val j copies train 5 j with a share of its values changed: some found, some not
        keep = rng.random(128) < 0.5 + j / 80
        val[j] = np.where(keep, train[5 * j], val[j])
    train[7, :] = val[50, :] = np.iinfo(np.uint32).max  # documents without shingles: never candidates
    index = TrainIndex(load_config(TINY, ["preflight.overlap_jaccard=0.8", "preflight.num_perm=128"]))
    b, r = index.bands, index.rows
    ids = [f"t{i}" for i in range(len(train))]
    index.add(Signed(ids[:250], train[:250]))
    index.add(Signed(ids[250:], train[250:]))
    lsh = MinHashLSH(threshold=0.8, num_perm=128, params=(b, r))
    for key, sig in zip(ids, train, strict=True):
        if key != "t7":  # Taxiway leaves shingle-less documents out of the index, as its caller did for datasketch
            lsh.insert(key, LeanMinHash(seed=1, hashvalues=sig, scheme="affine32"))
    vals = Signed([f"v{j}" for j in range(len(val))], val)
    found, _ = index.candidates(vals, cutoff=0.0)
    ours = {(v, t) for t, v, _ in found}
    theirs = {(f"v{j}", t) for j, sig in enumerate(val) if j != 50
              for t in lsh.query(LeanMinHash(seed=1, hashvalues=sig, scheme="affine32"))}
    assert ours == theirs and 5 < len(ours) < 40, len(ours)


@pytest.mark.parametrize("num_perm", [16, 64, 100, 128, 256])
def test_lsh_params_are_datasketchs_optimum(num_perm: int):
    """The closed-form rule must pick the (bands, rows) datasketch's numerical search picks."""
    from datasketch.lsh import _optimal_param

    from pipelines.preflight.minhash import FN_WEIGHT, FP_WEIGHT, lsh_params

    for threshold in (0.1, 0.3, 0.5, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95):
        assert lsh_params(threshold, num_perm) == _optimal_param(threshold, num_perm, FP_WEIGHT, FN_WEIGHT)


# --- shards --------------------------------------------------------------------------------

def _mixed(data: Path) -> Path:
    """The corpus with something for every check to report: a near-duplicate, a copy, a bad file."""
    _plant(data, 60, "near.txt")
    shutil.copyfile(data / "train" / "d001.txt", data / "train" / "copy.txt")
    (data / "train" / "bad.txt").write_bytes(b"\xff\xfe not UTF-8")
    _relist(data)
    return data


def _outputs(run_dir: Path) -> dict[str, bytes]:
    folder = run_dir / "preflight"
    out = {name: (folder / "checks" / f"{name}.json").read_bytes() for name in CHECK_NAMES}
    out["report.json"] = re.sub(rb'"created_at": "[^"]*"', b"", (folder / "report.json").read_bytes())
    out["overlap.png"] = (folder / "overlap.png").read_bytes()
    return out


def test_three_shards_equal_one_shard_per_split_byte_for_byte(data: Path, tmp_path: Path):
    from pipelines.preflight.shards import plan

    _mixed(data)
    whole, sharded = _cfg(data), _cfg(data, "preflight.shard_bytes=10000")
    assert [s.split for s in plan(whole)] == ["train", "val"]
    assert [s.split for s in plan(sharded)] == ["train", "train", "val"]
    # N workers ask for smaller shards; Airflow's map limit asks for larger ones (a shard per split at least)
    assert len(plan(whole, min_shards=6)) > 2 and [s.split for s in plan(sharded, max_shards=1)] == ["train", "val"]
    one = preflight.run(whole, tmp_path / "one", workers=1)
    three = preflight.run(sharded, tmp_path / "three", workers=2)  # forked scans and documents process
    assert not one.passed and {n for n, c in one.checks.items() if not c.passed} == {"documents", "overlap"}
    assert _outputs(tmp_path / "one") == _outputs(tmp_path / "three")
    assert three.summary() == one.summary()


def test_a_rescanned_shard_is_a_cache_hit_and_a_new_file_changes_one_shard(data: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch):
    from pipelines.preflight.minhash import MinHasher
    from pipelines.preflight.shards import plan, scan

    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "home"))  # a cache of its own (the tests' is shared)
    cfg = _cfg(_mixed(data), "preflight.shard_bytes=3000")
    shards = plan(cfg)
    first = [scan(cfg, s) for s in shards]
    assert len(shards) == 4 and not any(r.cache_hit for r in first)

    def signed_again(*args, **kwargs):
        raise AssertionError("a cached shard was signed again")

    monkeypatch.setattr(MinHasher, "signatures", signed_again)
    again = [scan(cfg, s) for s in shards]
    assert all(r.cache_hit for r in again)
    for a, b in zip(first, again, strict=True):
        assert (a.key, a.files, a.rows, a.digests, a.ids) == (b.key, b.files, b.rows, b.digests, b.ids)
        assert (a.sigs == b.sigs).all()
    preflight.run(cfg, tmp_path / "run", workers=1)  # the whole stage: every shard from the cache
    used = json.loads((tmp_path / "run" / "preflight" / "shards.json").read_text())["shards"]
    assert [(u["key"], u["cache_hit"]) for u in used] == [(r.key, True) for r in first]

    (data / "train" / "d010b.txt").write_text(_doc(500))  # content-defined boundaries: the other shards stay
    before = [[f.key for f in s.files] for s in shards]
    changed = [s for s in plan(cfg) if [f.key for f in s.files] not in before]
    assert len(changed) == 1 and "train/d010b.txt" in [f.key for f in changed[0].files]


def test_normalized_hash_collapses_exactly_what_a_whitespace_regex_matches():
    """The hash's split/join equals ``re.sub(r"\\s+", " ", ...).strip()`` (its definition) at every
    whitespace code point, mixed with text, case and NFKC forms."""
    import hashlib
    import unicodedata

    from pipelines.preflight.duplicates import normalized_hash

    spaces = "".join(chr(c) for c in range(0x110000) if re.match(r"\s", chr(c)))
    assert spaces == "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    for text in (f"{spaces}Ａb{spaces}C d\u00a0\u2028e{spaces}", "x" + "".join(f"{c}y{c}{c}" for c in spaces), ""):
        norm = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).lower()).strip()
        assert normalized_hash(text) == hashlib.blake2b(norm.encode(), digest_size=16).hexdigest()
