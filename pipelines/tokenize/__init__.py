"""Tokenize-and-pack, cached by content.

The cache key hashes the input files' sha256 (from the verified manifest), the tokenizer and
pack settings and the format version; an unchanged input is never tokenized twice. Output goes
to ``$TAXIWAY_HOME/cache/packed/<key>/`` through a staged folder and an atomic rename, so two
runs packing the same key at once never see or leave a half-written dataset.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines import atomic, manifest
from pipelines.config import RunConfig
from pipelines.documents import read_documents, split_files
from pipelines.paths import cache_dir
from pipelines.tokenize import bpe
from pipelines.tokenize.pack import SplitWriter, dtype_for

FORMAT_VERSION = 1
_BATCH = 256


@dataclass(frozen=True)
class Packed:
    path: Path
    key: str
    cache_hit: bool

    def manifest(self) -> dict:
        return json.loads((self.path / "manifest.json").read_text())


def cache_key(cfg: RunConfig) -> str:
    entries = sorted((e.split, e.path, e.sha256) for e in manifest.read(cfg.data.manifest))
    tok_file = bpe.file_sha256(cfg.tokenizer.path) if cfg.tokenizer.path else None
    material = {
        "format_version": FORMAT_VERSION, "files": entries, "data_format": cfg.data.format,
        "tokenizer": cfg.tokenizer.model_dump(mode="json"), "tokenizer_file": tok_file,
        "pack": cfg.pack.model_dump(mode="json"),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def _texts(spec: str, fmt: str | None):
    for path in split_files(spec):
        for _, text in read_documents(path, fmt):
            yield text


def run(cfg: RunConfig, run_dir: Path | None = None) -> Packed:
    key = cache_key(cfg)
    final = cache_dir() / "packed" / key
    hit = (final / "manifest.json").is_file()
    if not hit:
        with atomic.staged_dir(final) as stage:
            _build(cfg, key, stage)
    packed = Packed(final, key, hit)
    if run_dir is not None:
        atomic.write_json(Path(run_dir) / "tokenize" / "packed.json",
                          {"path": str(final), "key": key, "cache_hit": hit})
    return packed


def _build(cfg: RunConfig, key: str, out: Path) -> None:
    started = time.perf_counter()
    if cfg.tokenizer.path:
        tok = bpe.load(cfg.tokenizer.path, cfg.tokenizer.eos_token)
    else:
        tok = bpe.train(_texts(cfg.data.train, cfg.data.format), cfg.tokenizer)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    dtype = dtype_for(vocab)
    eos = tok.token_to_id(cfg.tokenizer.eos_token)
    np.save(out / "token_bytes.npy", bpe.token_bytes(tok))
    splits, chars = {}, 0
    for split in manifest.SPLITS:
        writer = SplitWriter(out / split, cfg.pack.seq_len, eos, dtype, cfg.pack.shard_tokens)
        for texts in bpe.batched(_texts(getattr(cfg.data, split), cfg.data.format), _BATCH):
            chars += sum(map(len, texts))
            for enc in tok.encode_batch(texts, add_special_tokens=False):
                writer.add(enc.ids)
        splits[split] = writer.close()
    if splits["val"]["windows"] == 0:
        raise ValueError(f"validation split packs into no window of {cfg.pack.seq_len + 1} tokens "
                         "(too little val text for pack.seq_len)")
    seconds = time.perf_counter() - started
    tokens = sum(s["tokens"] for s in splits.values())
    atomic.write_json(out / "manifest.json", {
        "format_version": FORMAT_VERSION, "key": key, "seq_len": cfg.pack.seq_len,
        "dtype": dtype.name, "vocab_size": vocab, "eos_id": eos,
        "tokenizer_sha256": bpe.file_sha256(out / "tokenizer.json"),
        "splits": splits,
        "stats": {"seconds": round(seconds, 3), "tokens_per_s": round(tokens / max(seconds, 1e-9)),
                  "chars_per_token": round(chars / max(1, tokens), 3)},
    })
