"""Tokenize-and-pack: exact round trip, exact boundary index, content-addressed cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import TINY
from pipelines import manifest
from pipelines.config import ConfigError, load_config
from trainer import fsio
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
    from pipelines import tokenize
    from pipelines.tokenize.bpe import load

    packed = tokenize.pack_splits(_cfg(corpus))
    m = packed.manifest()
    tok = load(packed.path / "tokenizer.json", "<|endoftext|>")
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

    packed = tokenize.pack_splits(_cfg(corpus))
    data = PackedSplit(packed.path, "train")
    eos = data.manifest["eos_id"]
    for i in range(len(data)):
        tokens, doc_ids = data.item(i)
        x = tokens[:-1]
        # a new document id starts exactly one position after each EOS inside the window
        after_eos = np.flatnonzero(x[:-1] == eos) + 1
        assert np.array_equal(np.flatnonzero(np.diff(doc_ids)) + 1, after_eos)


def test_concurrent_runs_build_one_entry_once(corpus: Path):
    """Two runs needing the same packed dataset at the same moment: one trains the tokenizer and packs,
    the other waits for it and finds the entry (a cache hit), as ten concurrent Celery runs must."""
    import threading

    from pipelines import tokenize

    start = threading.Barrier(2)
    results: list = []

    def one() -> None:
        cfg = _cfg(corpus)
        start.wait()
        results.append(tokenize.pack_splits(cfg))

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(p.cache_hit for p in results) == [False, True], results
    assert results[0].path == results[1].path and (results[0].path / "manifest.json").is_file()


def test_cache_hit_and_key_changes(corpus: Path):
    from pipelines import tokenize

    first = tokenize.pack_splits(_cfg(corpus))
    second = tokenize.pack_splits(_cfg(corpus))
    assert not first.cache_hit and second.cache_hit and first.path == second.path
    other = tokenize.pack_splits(_cfg(corpus, "pack.seq_len=8"))
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


def test_adding_files_tokenizes_only_their_groups(corpus: Path, tmp_path: Path):
    from pipelines import tokenize

    tok = tokenize.pack_splits(_cfg(corpus)).path / "tokenizer.json"
    shutil.copyfile(tok, tmp_path / "fixed-tokenizer.json")      # incremental runs keep the tokenizer
    first = tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={tmp_path / 'fixed-tokenizer.json'}"))
    assert first.manifest()["stats"]["groups_reused"] == 0
    (corpus / "train" / "new.txt").write_text("def brand_new():\n    return 'fresh text'\n")
    manifest.write(corpus / "manifest.jsonl", manifest.scan(corpus))
    second = tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={tmp_path / 'fixed-tokenizer.json'}"))
    stats = second.manifest()["stats"]
    assert second.key != first.key
    assert stats["groups_reused"] == stats["groups"] - 1, stats


def test_two_processes_packing_the_same_key(corpus: Path):
    """Both succeed with the same dataset; no temp folders are left in the cache."""
    import os
    import subprocess
    import sys

    code = ("import sys, json; from pipelines.config import load_config; from pipelines import tokenize; "
            "cfg = load_config(sys.argv[1], sys.argv[2:]); p = tokenize.pack_splits(cfg); "
            "print(json.dumps([str(p.path), p.key]))")
    args = [str(TINY), f"data.train={corpus / 'train'}", f"data.val={corpus / 'val'}",
            f"data.manifest={corpus / 'manifest.jsonl'}", "tokenizer.vocab_size=300", "pack.seq_len=16"]
    procs = [subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=os.environ) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert results[0] == results[1]
    cache = Path(os.environ["TAXIWAY_HOME"]) / "cache"
    assert not [p for p in cache.rglob("*.tmp")], "a staged folder was left behind"
    packed = Path(results[0][0])
    m = json.loads((packed / "manifest.json").read_text())
    for shard in m["splits"]["train"]["shards"]:
        assert fsio.sha256_file(packed / shard["path"]) == shard["sha256"]


@settings(max_examples=int(os.environ.get("TAXIWAY_HYPOTHESIS_EXAMPLES", "25")), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80),
                     min_size=1, max_size=30),
       seq_len=st.integers(1, 40))
@example(docs=["a <|endoftext|> inside a document is text, not a boundary"], seq_len=3)
def test_pack_round_trip_property(docs: list[str], seq_len: int, tmp_path: Path):
    """Any documents, any seq_len: the packed stream is exactly the encoded documents joined by
    EOS, minus a tail shorter than one window, and the boundary index marks every start."""
    from pipelines.tokenize.bpe import load
    from pipelines.tokenize.engine import batch_encoder
    from pipelines.tokenize.groups import _encode
    from pipelines.tokenize.pack import SplitWriter

    tok = load(_tokenizer_file(), "<|endoftext|>")
    eos = tok.token_to_id("<|endoftext|>")
    tokens, starts = _encode(docs, batch_encoder(tok, _tokenizer_file()), eos, np.dtype(np.uint16))
    folder = tmp_path / f"p{seq_len}-{len(docs)}"
    writer = SplitWriter(folder, seq_len, np.dtype(np.uint16), shard_tokens=3 * (seq_len + 1))
    writer.add_stream(tokens[: starts[len(starts) // 2]] if len(starts) > 1 else tokens[:0], starts[: len(starts) // 2])
    writer.add_stream(tokens[starts[len(starts) // 2]:] if len(starts) > 1 else tokens,
                      starts[len(starts) // 2:] - (starts[len(starts) // 2] if len(starts) > 1 else 0))
    info = writer.close()
    stream = np.concatenate([np.load(folder.parent / s["path"]) for s in info["shards"]]) if info["shards"] else np.empty(0)
    assert len(stream) % (seq_len + 1) == 0 and len(stream) + info["dropped_tokens"] == len(tokens)
    assert np.array_equal(stream, tokens[: len(stream)])
    pieces = np.split(tokens, np.flatnonzero(tokens == eos) + 1)[:-1]
    assert [tok.decode(p[:-1].tolist()) for p in pieces] == docs
    offset, marked = 0, []
    for s in info["shards"]:
        marked += (np.load(folder.parent / s["docs"]) + offset).tolist()
        offset += s["tokens"]
    assert marked == [int(x) for x in starts if x < len(stream)]


@settings(max_examples=int(os.environ.get("TAXIWAY_HYPOTHESIS_EXAMPLES", "25")) * 8, deadline=None, derandomize=True)
@given(texts=st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200)
                      | st.lists(st.sampled_from(["'s", "'ll", " ", "  ", "\n", "\t", "<|endoftext|>", "a", "Z", "9",
                                                  "é", "中", "🙂", "\u0301", "\u00a0", "_", "-", "."]),
                                 max_size=60).map("".join), min_size=1, max_size=20))
def test_fast_engine_gives_hfs_ids(texts: list[str]):
    """tiktoken is used for a plain byte-level BPE only because it reproduces HF's ids exactly."""
    from pipelines.tokenize.bpe import load
    from pipelines.tokenize.engine import batch_encoder

    tok = load(_tokenizer_file(), "<|endoftext|>")
    encode, one_thread = batch_encoder(tok, _tokenizer_file()), batch_encoder(tok, _tokenizer_file(), threads=1)
    assert encode.__name__ == one_thread.__name__ == "tiktoken_bpe"
    assert encode(texts) == one_thread(texts) == [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def test_each_encoding_thread_has_an_encoding_of_its_own(monkeypatch):
    """Threads sharing one tiktoken ``Encoding`` contend for its regex caches and do not scale
    (engine._tiktoken): every pool thread encodes with one it built, none with another's."""
    import threading

    from pipelines.tokenize import engine
    from pipelines.tokenize.bpe import load

    built: list[tuple[int, int]] = []  # (building thread, encoding)
    used: set[tuple[int, int]] = set()  # (encoding thread, encoding)

    def tracked(spec, special=None):
        enc = real(spec, special)
        built.append((threading.get_ident(), id(enc)))
        encode = enc.encode_to_numpy

        def encode_to_numpy(text, **kw):
            used.add((threading.get_ident(), id(enc)))
            threading.Event().wait(0.001)  # long enough for the other thread to take documents too
            return encode(text, **kw)

        enc.encode_to_numpy = encode_to_numpy
        return enc

    real = engine.tiktoken_encoding
    monkeypatch.setattr(engine, "tiktoken_encoding", tracked)
    tok = load(_tokenizer_file(), "<|endoftext|>")
    encode = engine.batch_encoder(tok, _tokenizer_file(), threads=2)
    texts = DOCS["train"] * 20
    assert encode(texts) == [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    assert len({thread for thread, _ in used}) == 2, used
    assert used <= set(built) and len(built) == len(set(built)) == 2, (built, used)


def test_engine_falls_back_to_hf_for_a_tokenizer_it_cannot_reproduce(tmp_path: Path):
    from tokenizers import normalizers

    from pipelines.tokenize.bpe import load
    from pipelines.tokenize.engine import batch_encoder

    tok = load(_tokenizer_file(), "<|endoftext|>")
    tok.normalizer = normalizers.Lowercase()
    tok.save(str(tmp_path / "tokenizer.json"))
    tok = load(tmp_path / "tokenizer.json", "<|endoftext|>")
    encode = batch_encoder(tok, tmp_path / "tokenizer.json")
    one_thread = batch_encoder(tok, tmp_path / "tokenizer.json", threads=1)  # a shard task's: document by document
    assert encode.__name__ == one_thread.__name__ == "hf_tokenizers"
    texts = ["Hello World", *DOCS["val"], "<|endoftext|> as text"]
    assert encode(texts) == one_thread(texts) == [tok.encode(t, add_special_tokens=False).ids for t in texts]
    assert encode(["Hello World"]) == encode(["hello world"])  # the normalizer ran: HF did the encoding


def test_engine_refuses_what_tiktoken_could_not_reproduce():
    """Each structural difference from a plain byte-level BPE keeps the HF engine (not a crash)."""
    import copy

    from pipelines.tokenize.engine import _not_plain

    spec = json.loads(_tokenizer_file().read_text())
    assert _not_plain(spec) is None
    cases = {"has a normalizer": lambda s: s.update(normalizer={"type": "Lowercase"}),
             "not byte-level": lambda s: s["model"]["vocab"].update({"€x": len(s["model"]["vocab"])}),
             "merge order": lambda s: s["model"]["merges"].reverse(),
             "single bytes": lambda s: s["model"]["vocab"].pop("Ġ")}
    for needle, change in cases.items():
        broken = copy.deepcopy(spec)
        change(broken)
        assert needle in (_not_plain(broken) or ""), needle


_TOKENIZER: list[Path] = []


def _tokenizer_file() -> Path:
    """A small byte-level BPE trained once per session (all 256 bytes are in its alphabet)."""
    if not _TOKENIZER:
        import tempfile

        from pipelines.config import TokenizerConfig
        from pipelines.tokenize import bpe

        path = Path(tempfile.mkdtemp()) / "tokenizer.json"
        bpe.train([d for docs in DOCS.values() for d in docs], TokenizerConfig(vocab_size=300)).save(str(path))
        _TOKENIZER.append(path)
    return _TOKENIZER[0]


def test_bad_inputs_leave_nothing_half_written(corpus: Path, tmp_path: Path):
    import os

    from pipelines import tokenize
    from pipelines.documents import DocumentError
    from pipelines.tokenize.bpe import TokenizerError

    cache = Path(os.environ["TAXIWAY_HOME"]) / "cache"
    (tmp_path / "broken.json").write_text('{"secret-in-the-file": 1}')  # the library's error quotes it
    with pytest.raises(TokenizerError, match=r"broken.json: not a tokenizer.json the tokenizers library loads") as err:
        tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={tmp_path / 'broken.json'}"))
    assert "secret-in-the-file" not in str(err.value)
    with pytest.raises(ValueError, match=r"pack.dtype: vocabulary of \d+ tokens does not fit uint16"):
        big = _tokenizer_file()
        from tokenizers import Tokenizer

        t = Tokenizer.from_file(str(big))
        t.add_tokens([f"<extra{i}>" for i in range(70_000)])
        t.save(str(tmp_path / "big.json"))
        tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={tmp_path / 'big.json'}", "pack.dtype=uint16"))
    # limits are held to the model built on the real vocabulary, not to tokenizer.vocab_size (a 300k-token
    # file estimated at 0.8 B parameters became 3.27 B)
    with pytest.raises(ConfigError, match=r"the tokenizer's 70,300 tokens\) has [\d,]+ parameters, over limits.parameters"):
        tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={tmp_path / 'big.json'}", "limits.parameters=1000000"))
    (corpus / "train" / "005.txt").write_bytes(b"\xff\xfe broken utf-8")
    manifest.write(corpus / "manifest.jsonl", manifest.scan(corpus))
    with pytest.raises(DocumentError, match=r"train/005.txt: invalid UTF-8"):
        tokenize.pack_splits(_cfg(corpus))
    assert not [p for p in cache.rglob("*.tmp")]
    assert not (cache / "packed").exists() or not any((cache / "packed").iterdir())


def test_parent_tokenizer_is_kept_and_a_mismatch_refused(corpus: Path, tmp_path: Path):
    from pipelines.stages.parent import tokenizer as parent_tokenizer

    parent = tmp_path / "parent"
    parent.mkdir()
    shutil.copyfile(_tokenizer_file(), parent / "tokenizer.json")
    assert parent_tokenizer(_cfg(corpus, "parent=models:/m/1"), parent) == parent / "tokenizer.json"
    same = tmp_path / "same.json"
    shutil.copyfile(_tokenizer_file(), same)
    assert parent_tokenizer(_cfg(corpus, "parent=models:/m/1", f"tokenizer.path={same}"), parent)
    other = tmp_path / "other.json"
    other.write_text(_tokenizer_file().read_text().replace("<|endoftext|>", "<|eot|>"))
    with pytest.raises(ValueError, match=r"other.json differs from the parent model's tokenizer \(models:/m/1"):
        parent_tokenizer(_cfg(corpus, "parent=models:/m/1", f"tokenizer.path={other}"), parent)


def test_val_only_packing_with_a_given_tokenizer(corpus: Path):
    """What evaluation needs for a baseline with another tokenizer: val packed, train untouched."""
    from pipelines import tokenize

    both = tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={_tokenizer_file()}"))
    val = tokenize.pack_splits(_cfg(corpus, f"tokenizer.path={_tokenizer_file()}"), splits=("val",))
    assert val.key != both.key
    assert set(val.manifest()["splits"]) == {"val"}
    assert val.manifest()["splits"]["val"]["tokens"] == both.manifest()["splits"]["val"]["tokens"]


def test_groups_encoded_ahead_equal_groups_encoded_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Batches encode ahead across group boundaries; every group's stream is still its own
    documents in order, cache hits interleaved included."""
    from pipelines import storage
    from pipelines.run_folder import Cache
    from pipelines.tokenize import groups
    from pipelines.tokenize.bpe import load
    from pipelines.tokenize.engine import batch_encoder

    monkeypatch.setattr(groups, "_BATCH_DOCS", 2)  # several batches per group, more than _AHEAD in flight
    tok = load(_tokenizer_file(), "<|endoftext|>")
    eos, dtype = tok.token_to_id("<|endoftext|>"), np.dtype(np.uint16)
    encode = batch_encoder(tok, _tokenizer_file())
    docs = DOCS["train"] + DOCS["val"]
    for i, text in enumerate(docs):
        (tmp_path / f"{i:03d}.txt").write_text(text)
    refs = [groups.FileRef(f"train/{i:03d}.txt", hashlib.sha256(text.encode()).hexdigest(),
                           storage.locate(str(tmp_path / f"{i:03d}.txt"))) for i, text in enumerate(docs)]
    cut = [refs[i:i + 7] for i in range(0, len(refs), 7)]
    cache = Cache(tmp_path / "cache")
    groups.tokenize_group(cut[2], encode, "tok", eos, dtype, None, cache)  # one group already cached
    streams = list(groups.tokenize_groups(cut, encode, "tok", eos, dtype, None, cache))
    assert [s.cache_hit for s in streams] == [i == 2 for i in range(len(cut))]
    for group, stream in zip(cut, streams, strict=True):
        texts = [docs[int(ref.path[6:9])] for ref in group]
        expected = [t for text in texts for t in tok.encode(text, add_special_tokens=False).ids + [eos]]
        assert stream.tokens.tolist() == expected
        assert stream.starts.tolist() == np.cumsum([0] + [len(tok.encode(t, add_special_tokens=False).ids) + 1
                                                          for t in texts[:-1]]).tolist()


def test_tokenizer_learns_from_a_bounded_sample_chosen_by_content(corpus: Path):
    """``tokenizer.train_max_bytes``: whole train files in sha256 order up to the cap; a new file that
    sorts after the sample leaves the tokenizer (and its cache entry) as it was."""
    from pipelines import tokenize

    cfg = _cfg(corpus, "tokenizer.train_max_bytes=200")
    refs = tokenize._split_refs(cfg, "train", manifest.read(cfg.data.manifest))
    sample = tokenize.training_sample(refs, 200)
    sizes = [os.path.getsize(r.loc.path) for r in sample]
    assert [r.sha256 for r in sample] == sorted(r.sha256 for r in refs)[:len(sample)]
    assert 1 < len(sample) < len(refs) and sum(sizes[:-1]) < 200 <= sum(sizes)
    first = tokenize.tokenizer_for(cfg, refs)

    last = max(r.sha256 for r in sample)
    text = next(t for i in range(10_000) if hashlib.sha256((t := f"x = {i}\n").encode()).hexdigest() > last)
    (corpus / "train" / "new.txt").write_text(text)
    manifest.write(corpus / "manifest.jsonl", manifest.scan(corpus))
    grown = tokenize._split_refs(cfg, "train", manifest.read(cfg.data.manifest))
    assert tokenize.tokenizer_for(cfg, grown) == first       # same key: no retraining
    assert tokenize.training_sample(refs, None) == refs


def _packed_files(packed) -> dict[str, str]:
    """sha256 of every file of a packed dataset; of its manifest, all but ``stats`` (timings, reuse)."""
    files = {str(p.relative_to(packed.path)): fsio.sha256_file(p) for p in sorted(packed.path.rglob("*"))
             if p.is_file() and p.name != "manifest.json"}
    return {**files, "manifest.json": {k: v for k, v in packed.manifest().items() if k != "stats"}}


def test_three_shards_then_pack_equal_the_unsharded_pack(corpus: Path, tmp_path: Path, monkeypatch):
    """The mapped tokenize (plan, three shard tasks, pack) gives the unsharded dataset byte for byte
    under the same key; the pack only packs, and a re-run shard finds every group cached."""
    from pipelines import stages
    from pipelines.tokenize import groups

    monkeypatch.setattr(groups, "_SPREAD", 4)  # about a dozen groups in this small corpus, not 2
    cfg = _cfg(corpus, "pack.shard_bytes=1500")
    for home in ("unsharded", "sharded"):  # a cache each: the sharded run reuses nothing of the other
        monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / home))
        stages.prepare.prepare(cfg, tmp_path / home / "run")
    run_a, run_b = tmp_path / "unsharded" / "run", tmp_path / "sharded" / "run"
    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "unsharded"))
    whole = stages.tokenize.reduce(cfg, run_a)

    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "sharded"))
    shards = stages.tokenize.plan(cfg, run_b)
    assert len(shards) == 3 and all(s["groups"] for s in shards), shards
    stats = [stages.tokenize.shard(run_b, s["shard"]) for s in shards]
    assert [s["encoded"] for s in stats] == [s["groups"] for s in shards] and all(s["tokens"] for s in stats)
    packed = stages.tokenize.reduce(cfg, run_b)
    m = packed.manifest()["stats"]
    assert not packed.cache_hit and m["groups_reused"] == m["groups"] == sum(s["groups"] for s in shards)
    assert packed.key == whole.key
    assert packed.path.relative_to(tmp_path / "sharded") == whole.path.relative_to(tmp_path / "unsharded")
    ours = _packed_files(packed)
    assert ours == _packed_files(whole) and {"train/tokens-00000.npy", "val/docs-00000.npy"} <= set(ours)

    again = stages.tokenize.shard(run_b, 1)
    assert again["cached"] == again["groups"] == shards[1]["groups"] and again["encoded"] == again["tokens"] == 0
    # two runs encoding the same shard at once (ten concurrent runs of one corpus): one encodes, one waits
    shutil.rmtree(tmp_path / "sharded" / "cache" / "tokens")
    stages.prepare.prepare(cfg, run_c := tmp_path / "sharded" / "run-c")
    stages.tokenize.plan(cfg, run_c)
    start, results = threading.Barrier(2), []

    def one(run: Path) -> None:
        start.wait()
        results.append(stages.tokenize.shard(run, 0))

    threads = [threading.Thread(target=one, args=(run,)) for run in (run_b, run_c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r["encoded"] for r in results) == [0, shards[0]["groups"]], results
    # past the most tasks Airflow maps, the shards grow instead; below the fewest asked, they shrink
    for shape, count in (({"max_shards": 1}, 1), ({"max_shards": 2}, 2), ({"min_shards": 6}, 6)):
        other = stages.tokenize.plan(cfg, run_b, **shape)
        assert len(other) == count and sum(s["groups"] for s in other) == sum(s["groups"] for s in shards), other


@pytest.mark.timeout(120)
def test_shards_on_two_processes_equal_the_unsharded_pack(corpus: Path, tmp_path: Path, monkeypatch):
    """``taxiway tokenize --workers 2``'s path: the shards encoded by two forked processes, after
    this process encoded one itself (a forked worker must not use the encoder it inherits: its
    thread pool has no threads there, and the worker would wait forever)."""
    from pipelines import stages

    whole = stages.tokenize.reduce(_cfg(corpus, f"tokenizer.path={_tokenizer_file()}"), tmp_path / "run-a")
    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "two"))
    cfg = _cfg(corpus, f"tokenizer.path={_tokenizer_file()}", "pack.shard_bytes=1")  # one group a shard
    stages.prepare.prepare(cfg, tmp_path / "run-b")
    stages.tokenize.plan(cfg, tmp_path / "run-b")
    assert stages.tokenize.shard(tmp_path / "run-b", 0)["encoded"] == 1
    shutil.rmtree(tmp_path / "two" / "cache" / "tokens")
    packed = stages.tokenize.run(cfg, tmp_path / "run-b", 2)
    stats = packed.manifest()["stats"]
    assert packed.key == whole.key and stats["groups_reused"] == stats["groups"] > 1, stats
    assert _packed_files(packed) == _packed_files(whole)


def test_a_file_that_differs_from_its_manifest_entry_is_never_cached_under_that_entry(corpus: Path, tmp_path: Path, monkeypatch):
    """Cache keys hash the manifest's sha256 of each file; tokenize shards and the tokenizer start
    beside the preflight checks, before the manifest check has judged the files. A tampered file is
    therefore an error naming it, and nothing it went into is cached: once the file is put back,
    the tokens and the tokenizer are those of the manifest's content, not of the tampered one."""
    from pipelines import tokenize
    from pipelines.documents import DocumentError

    victim = corpus / "train" / "005.txt"
    original = victim.read_bytes()
    victim.write_bytes(original.replace(b"return", b"yield"))
    for cfg in (_cfg(corpus), _cfg(corpus, f"tokenizer.path={_tokenizer_file()}")):  # trained, then given
        with pytest.raises(DocumentError, match=r"train/005\.txt: content differs from the manifest"):
            tokenize.pack_splits(cfg)
    victim.write_bytes(original)
    first = tokenize.pack_splits(_cfg(corpus))
    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path / "clean-home"))  # an empty cache: what the manifest's content gives
    clean = tokenize.pack_splits(_cfg(corpus))
    assert first.key == clean.key and _packed_files(first) == _packed_files(clean)


def test_a_small_remainder_joins_the_last_shard_instead_of_a_task_of_its_own(corpus: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch):
    """A shard task costs about half a second before it encodes anything: the x10 corpus's seventh
    shard held one 8 KB group beside six of 17-21 MB. A remainder under half a shard joins the last
    one; a larger one stays a shard; every group is kept, in order."""
    from pipelines import stages
    from pipelines.tokenize import groups
    from pipelines.tokenize.shards import cut

    names = [[f"g{i}"] for i in range(6)]
    assert cut(names[:4], [10, 10, 10, 1], 10, fold_under=5) == [[["g0"]], [["g1"]], [["g2"], ["g3"]]]
    assert cut(names[:4], [10, 10, 10, 1], 10) == [[["g0"]], [["g1"]], [["g2"]], [["g3"]]]
    assert cut(names[:3], [10, 10, 6], 10, fold_under=5) == [[["g0"]], [["g1"]], [["g2"]]]
    assert cut(names[:3], [3, 3, 3], 10, fold_under=5) == [[["g0"], ["g1"], ["g2"]]]  # all remainder: one shard
    assert cut(names, [4, 7, 2, 2, 9, 1], 10, fold_under=5) == [[["g0"], ["g1"]], [["g2"], ["g3"], ["g4"], ["g5"]]]

    # the plan: this corpus's 14 groups (4,957 bytes) at 1,800 a shard cut to 2,031 + 2,100 + 826 bytes;
    # the 826 ride with the second shard
    monkeypatch.setattr(groups, "_SPREAD", 4)
    monkeypatch.setenv("TAXIWAY_HOME", str(tmp_path))
    cfg = _cfg(corpus, "pack.shard_bytes=1800")
    stages.prepare.prepare(cfg, run := tmp_path / "run")
    shards = stages.tokenize.plan(cfg, run)
    assert [s["bytes"] for s in shards] == [2031, 2100 + 826] and sum(s["groups"] for s in shards) == 14, shards
