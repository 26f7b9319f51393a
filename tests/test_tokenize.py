"""Tokenize-and-pack: exact round trip, exact boundary index, content-addressed cache."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import TINY
from pipelines import manifest
from pipelines.config import load_config
from trainer.data import PackedSplit, ShardedSampler

DOCS = {
    "train": [f"def f{i}(x):\n    return x * {i}  # café {i}\n" * (1 + i % 4) for i in range(40)],
    "val": [f"class C{i}:\n    pass  # ünïcode {i}\n" * (1 + i % 3) for i in range(12)],
}


@pytest.fixture()
def corpus(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "home"))
    for split, docs in DOCS.items():
        (tmp_path / split).mkdir()
        for i, text in enumerate(docs):
            (tmp_path / split / f"{i:03d}.txt").write_text(text)
    manifest.write(tmp_path / "manifest.jsonl", manifest.scan(tmp_path))
    return tmp_path


def _cfg(corpus: Path, *extra: str):
    return load_config(TINY, [f"data.train={corpus / 'train'}", f"data.val={corpus / 'val'}",
                              f"data.manifest={corpus / 'manifest.jsonl'}", "tokenizer.vocab_size=300",
                              "pack.seq_len=16", "pack.shard_tokens=100", *extra])


def test_round_trip_and_boundaries(corpus: Path):
    from tokenizers import Tokenizer

    from pipelines import tokenize

    packed = tokenize.run(_cfg(corpus))
    m = packed.manifest()
    tok = Tokenizer.from_file(str(packed.path / "tokenizer.json"))
    eos = m["eos_id"]
    for split, docs in DOCS.items():
        stream = np.concatenate([np.load(packed.path / s["path"]) for s in m["splits"][split]["shards"]])
        expected = np.concatenate([np.asarray(tok.encode(d, add_special_tokens=False).ids + [eos]) for d in docs])
        assert len(stream) % 17 == 0 and len(stream) == len(expected) - m["splits"][split]["dropped_tokens"]
        assert np.array_equal(stream, expected[:len(stream)])
        # decoding every document between EOS separators gives the originals back, in order
        pieces = np.split(expected, np.flatnonzero(expected == eos) + 1)[:-1]
        assert [tok.decode(p[:-1].tolist()) for p in pieces] == docs
        # the boundary index holds exactly the offsets where documents start, shard by shard
        offset, doc_starts = 0, np.concatenate([[0], np.flatnonzero(expected == eos)[:-1] + 1])
        for shard in m["splits"][split]["shards"]:
            starts = np.load(packed.path / shard["docs"])
            in_shard = doc_starts[(doc_starts >= offset) & (doc_starts < offset + shard["tokens"])] - offset
            assert np.array_equal(starts, in_shard)
            offset += shard["tokens"]
        assert m["splits"][split]["documents"] == len(docs)
        assert len(m["splits"][split]["shards"]) > 1, "shard_tokens=100 must split the stream"


def test_reader_doc_ids_restart_after_eos(corpus: Path):
    from pipelines import tokenize

    packed = tokenize.run(_cfg(corpus))
    data = PackedSplit(packed.path, "train")
    eos = data.manifest["eos_id"]
    for i in range(len(data)):
        tokens, doc_ids = data.item(i)
        x = tokens[:-1]
        # a new document id starts exactly one position after each EOS inside the window
        after_eos = np.flatnonzero(x[:-1] == eos) + 1
        assert np.array_equal(np.flatnonzero(np.diff(doc_ids)) + 1, after_eos)


def test_cache_hit_and_key_changes(corpus: Path):
    from pipelines import tokenize

    first = tokenize.run(_cfg(corpus))
    second = tokenize.run(_cfg(corpus))
    assert not first.cache_hit and second.cache_hit and first.path == second.path
    other = tokenize.run(_cfg(corpus, "pack.seq_len=8"))
    assert other.key != first.key


def test_sampler_resume_matches_uninterrupted():
    full = ShardedSampler(50, 4, rank=1, world_size=2, seed=7)
    expected = [full.next_indices().tolist() for _ in range(20)]
    part = ShardedSampler(50, 4, rank=1, world_size=2, seed=7)
    got = [part.next_indices().tolist() for _ in range(9)]
    resumed = ShardedSampler(50, 4, rank=1, world_size=2, seed=7)
    resumed.load_state_dict(json.loads(json.dumps(part.state_dict())))
    got += [resumed.next_indices().tolist() for _ in range(11)]
    assert got == expected
    other_rank = ShardedSampler(50, 4, rank=0, world_size=2, seed=7)
    assert not set(other_rank.next_indices()) & set(expected[0])
