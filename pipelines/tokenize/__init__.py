"""Tokenize-and-pack, cached by content at two levels.

1. The tokenizer: trained on the train split (cached by the train files' sha256 and the
   tokenizer settings) or loaded from ``tokenizer.path``.
2. Token streams per group of input files (``groups.py``): an unchanged group is never
   tokenized again, so adding files to a corpus tokenizes only the groups they land in.

The packed dataset's key hashes the group keys, the pack settings and the format version; a
repeat run with the same inputs is a hit that tokenizes nothing. Every output is written to a
staged folder and renamed into place, so two runs packing the same key at once never see or
leave a half-written dataset (the second keeps the first's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipelines import heap, manifest, storage
from pipelines.config import ConfigError, RunConfig, limits
from pipelines.documents import read_documents, split_files
from pipelines.errors import BadInput
from pipelines.run_folder import Cache, RunFolder, cache_dir
from pipelines.tokenize import bpe, engine
from pipelines.tokenize.groups import FORMAT_VERSION, FileRef, split_groups, tokenize_groups
from pipelines.tokenize.pack import SplitWriter, dtype_for
from trainer import fsio

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from pipelines.refresh.replay import Replay

log = logging.getLogger("taxiway.tokenize")


@dataclass(frozen=True)
class Packed:
    path: Path
    key: str
    cache_hit: bool

    def manifest(self) -> dict:
        return json.loads((self.path / "manifest.json").read_text())


def _split_refs(cfg: RunConfig, split: str, entries: list[manifest.Entry]) -> list[FileRef]:
    root = manifest.root_of(cfg.data.manifest)
    by_path = {root.join(e.path).path: e for e in entries if e.split == split}
    refs = []
    for loc in split_files(getattr(cfg.data, split)):
        entry = by_path.get(loc.path)
        if entry is None:  # preflight allowed an unlisted file: key it by content
            refs.append(FileRef(loc.uri(), storage.sha256(loc), loc))
        else:
            refs.append(FileRef(entry.path, entry.sha256, loc))
    return refs


def training_sample(train: list[FileRef], max_bytes: int | None) -> list[FileRef]:
    """The train files the BPE learns from: all of them, or whole files in sha256 order until
    ``max_bytes`` is reached (the last one may pass it). By content, not name, so the sample is the
    same wherever the files live, and new files change it only when they sort into it."""
    if max_bytes is None:
        return train
    sample, total = [], 0
    for ref in sorted(train, key=lambda f: (f.sha256, f.path)):
        if total >= max_bytes:
            break
        sample.append(ref)
        total += storage.size(ref.loc)
    return sample


def tokenizer_for(cfg: RunConfig, train: list[FileRef]) -> Path:
    """``tokenizer.path`` if set, else a BPE trained on the train split's ``training_sample``
    (cached by its content)."""
    if cfg.tokenizer.path:
        return Path(cfg.tokenizer.path)
    train = training_sample(train, cfg.tokenizer.train_max_bytes)
    material = [FORMAT_VERSION, cfg.tokenizer.model_dump(mode="json"), cfg.data.format,
                sorted((f.path, f.sha256) for f in train)]
    cache = Cache(cache_dir())
    folder = cache.tokenizer(hashlib.sha256(json.dumps(material).encode()).hexdigest()[:32])
    if not (folder / "tokenizer.json").is_file():
        with cache.building(folder):
            if not (folder / "tokenizer.json").is_file():  # else trained by another run meanwhile
                texts = (text for ref in train for _, text in read_documents(ref.loc, cfg.data.format, ref.sha256))
                with fsio.staged_dir(folder) as stage:
                    bpe.train(texts, cfg.tokenizer).save(str(stage / "tokenizer.json"))
    return folder / "tokenizer.json"


@dataclass(frozen=True)
class Inputs:
    """What packing reads: the tokenizer, the token dtype and each split's file groups, in order."""

    tok_path: Path
    tok_sha: str
    tok: Tokenizer
    dtype: np.dtype
    groups: dict[str, list[list[FileRef]]]
    bytes: dict[str, int]      # file size by manifest path, for cutting the groups into shards


def inputs(cfg: RunConfig, splits: tuple[str, ...] = manifest.SPLITS) -> Inputs:
    """The tokenizer (trained on the train split unless ``tokenizer.path``) and the groups of ``splits``."""
    entries = manifest.read(cfg.data.manifest)
    refs = {split: _split_refs(cfg, split, entries) for split in manifest.SPLITS if split in splits
            or (split == "train" and not cfg.tokenizer.path)}
    tok_path = tokenizer_for(cfg, refs.get("train", []))
    tok = bpe.load(tok_path, cfg.tokenizer.eos_token)
    if built := limits.problems(cfg, tok.get_vocab_size()):  # the model the trainer builds on this vocabulary
        raise ConfigError({"limits": "; ".join(built)}, str(tok_path))
    return Inputs(tok_path, fsio.sha256_file(tok_path), tok, dtype_for(tok.get_vocab_size(), cfg.pack.dtype),
                  {split: split_groups(refs[split]) for split in manifest.SPLITS if split in splits},
                  {e.path: e.bytes for e in entries})


def pack_splits(cfg: RunConfig, run_dir: Path | None = None, splits: tuple[str, ...] = manifest.SPLITS,
        replay: Replay | None = None, link: Path | None = None) -> Packed:
    """Pack ``splits`` (default both; evaluation of a baseline with another tokenizer needs only val);
    a refresh adds ``replay`` documents of older data to the train split. The run folder's link to
    the result is ``link`` (default ``tokenize/packed.json``). Groups the shard tasks encoded
    (``shards.py``) are cache hits here, so after them this only packs."""
    started = time.perf_counter()
    data = inputs(cfg, splits)
    tok_path, tok_sha, tok, dtype, groups = data.tok_path, data.tok_sha, data.tok, data.dtype, data.groups
    key = hashlib.sha256(json.dumps([
        FORMAT_VERSION, tok_sha, cfg.data.format, dtype.name,
        cfg.pack.model_dump(mode="json", exclude={"shard_bytes"}),  # how the work is spread, not what is packed
        {s: [[(f.path, f.sha256) for f in g] for g in gs] for s, gs in groups.items()},
        *([replay.material()] if replay else [])]).encode()).hexdigest()[:32]
    cache = Cache(cache_dir())
    final = cache.packed(key)
    hit = (final / "manifest.json").is_file()
    if not hit:
        with cache.building(final):
            hit = (final / "manifest.json").is_file()  # built by another run while this one waited
            if not hit:
                with fsio.staged_dir(final) as stage:
                    _build(cfg, key, stage, tok, tok_path, tok_sha, dtype, groups, started, replay)
    packed = Packed(final, key, hit)
    if run_dir is not None:
        fsio.write_json(link or RunFolder(run_dir).packed_link,
                          {"path": str(final), "key": key, "cache_hit": hit,
                           "seconds": round(time.perf_counter() - started, 3)})
    return packed


def _build(cfg: RunConfig, key: str, out: Path, tok, tok_path: Path, tok_sha: str, dtype: np.dtype,
           groups: dict[str, list[list[FileRef]]], started: float, replay: Replay | None) -> None:
    eos = tok.token_to_id(cfg.tokenizer.eos_token)
    encode = engine.batch_encoder(tok, tok_path)
    (out / "tokenizer.json").write_bytes(Path(tok_path).read_bytes())
    np.save(out / "token_bytes.npy", bpe.token_bytes(tok))
    splits, chars, reused, doc_tokens, replayed = {}, 0, 0, {}, None
    for split, split_groups_ in groups.items():
        writer = SplitWriter(out / split, cfg.pack.seq_len, dtype, cfg.pack.shard_tokens)
        lengths = []
        for stream in tokenize_groups(split_groups_, encode, tok_sha, eos, dtype, cfg.data.format, Cache(cache_dir())):
            writer.add_stream(stream.tokens, stream.starts)
            heap.trim()  # the Rust tokenizer's freed batch buffers go back now: the peak stays one group's
            lengths.append(np.diff(np.append(stream.starts, len(stream.tokens))))
            chars += stream.chars
            reused += stream.cache_hit
        if split == "train" and replay is not None:
            replayed = _add_replay(replay, writer, encode, tok_sha, eos, dtype, cfg.data.format, lengths)
        splits[split] = writer.close()
        doc_tokens[split] = np.concatenate(lengths) if lengths else np.empty(0, np.int64)
    if splits["val"]["windows"] == 0:
        raise BadInput(f"validation split packs into no window of {cfg.pack.seq_len + 1} tokens "
                         "(too little val text for pack.seq_len)")
    seconds = time.perf_counter() - started
    tokens = sum(s["tokens"] for s in splits.values())
    edges = np.unique(np.geomspace(1, max(2, max((int(d.max()) for d in doc_tokens.values() if len(d)), default=2)), 13).astype(int))
    fsio.write_json(out / "manifest.json", {
        "format_version": FORMAT_VERSION, "key": key, "seq_len": cfg.pack.seq_len,
        "dtype": dtype.name, "vocab_size": tok.get_vocab_size(), "eos_id": eos, "tokenizer_sha256": tok_sha,
        "splits": splits,
        "stats": {"seconds": round(seconds, 3), "tokens_per_s": round(tokens / max(seconds, 1e-9)),
                  "chars_per_token": round(chars / max(1, tokens), 3),
                  "groups": sum(len(g) for g in groups.values()), "groups_reused": reused,
                  **({"replay": replayed} if replay is not None else {}),
                  "encoder": encode.__name__,
                  "tokens_per_document": {s: {"mean": float(d.mean()) if len(d) else 0.0,
                                              "histogram": {"edges": edges.tolist(),
                                                            "counts": np.histogram(d, edges)[0].tolist()}}
                                          for s, d in doc_tokens.items()}},
    })
    log.info("packed %s: %d tokens in %.2f s (%d of %d token groups reused)", key, tokens, seconds, reused,
             sum(len(g) for g in groups.values()))


def _add_replay(replay: Replay, writer: SplitWriter, encode, tok_sha: str, eos: int, dtype: np.dtype,
                data_format: str | None, lengths: list[np.ndarray]) -> dict:
    """Append the replayed documents to the train split; what was replayed, and how many old groups
    the cache answered (one it lost is encoded again, or left out when its trained text is gone)."""
    new_tokens = int(sum(d.sum() for d in lengths))
    streams, counts = replay.streams(new_tokens, encode, tok_sha, eos, dtype, data_format, Cache(cache_dir()))
    docs = tokens = 0
    for kept in streams:
        writer.add_stream(kept.tokens, kept.starts)
        heap.trim()  # the Rust tokenizer's freed batch buffers go back now: the peak stays one group's
        lengths.append(np.diff(np.append(kept.starts, len(kept.tokens))))
        docs, tokens = docs + len(kept.starts), tokens + len(kept.tokens)
    log.info("replayed %d old documents (%d tokens) from %d token groups, %d of them from the cache",
             docs, tokens, counts["groups"], counts["groups_reused"])
    return {"documents": docs, "tokens": tokens, **counts, "fraction": replay.fraction, "seed": replay.seed}
