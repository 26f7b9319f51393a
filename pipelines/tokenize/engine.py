"""Batch encoders for a tokenizer: tiktoken's BPE when it gives the very same ids, else HF's.

HF ``tokenizers`` builds a full ``Encoding`` per document (token strings, offsets, masks) that
packing throws away; tiktoken returns the ids only and runs the same byte-level BPE faster
(``bench/tokenize_bench.py``; figures in docs/benchmarks.md). The two agree when the tokenizer is a plain byte-level BPE
— no normalizer, the GPT-2 split pattern without a prefix space, no dropout, no subword
prefixes or suffixes, no byte fallback — whose merged tokens are numbered in merge order: then
"merge the adjacent pair with the lowest merge rank" (HF) and "merge the adjacent pair whose
concatenation has the lowest token id" (tiktoken) pick the same pair at every step. That is what
``bpe.train`` produces. Anything else, or a tokenizer whose ids differ from HF's on the probe
texts below, is encoded by HF. Special tokens inside documents are text for both (the loaded
tokenizer has ``encode_special_tokens``; tiktoken is never allowed a special token).

Packing wants flat arrays, not Python lists: tiktoken's ``encode_to_numpy`` hands each document's
ids over as one uint32 buffer, where ``encode_ordinary`` builds a Python int per token that
packing then walks again (~17% of the engine's CPU time on the demo corpus, in development
measurement).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


class Encoder:
    """A batch encoder: ``arrays(texts)`` gives each document's ids as a uint32 array (what
    packing uses); calling it gives them as lists. ``__name__`` says which engine it is
    (``tiktoken_bpe`` or ``hf_tokenizers``)."""

    def __init__(self, name: str, arrays: Callable[[list[str]], list[np.ndarray]]) -> None:
        self.__name__ = name
        self.arrays = arrays

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [a.tolist() for a in self.arrays(texts)]

# GPT-2's pre-tokenizer pattern, the one HF's ByteLevel(use_regex=True) applies
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_PROBES = [
    "def f(x):\n    return x  # ok\n\n\n", "Hello, World! It's 2026; we'll see.\t\r\n",
    "naïve café — “quotes” ’s 中文字符 🙂🙂 e\u0301 \u00a0\u2003 x", "   leading and trailing   ",
    "<|endoftext|> inside text <|endoftext|>", "a" * 300 + " " + "ab" * 150, "123 4567 89.0 1e-5 0x1F",
]


def batch_encoder(tok, tok_path: str | Path, threads: int | None = None) -> Encoder:
    """The fastest encoder that reproduces ``tok``'s ids (``tok`` as ``bpe.load`` returns it),
    encoding on ``threads`` threads (default: every core this process may use). A mapped shard
    task asks for one, so N of them on N cores scale instead of fighting over every core."""
    hf = _hf(tok, threads)
    spec = json.loads(Path(tok_path).read_text())
    reason = _not_plain(spec)
    if reason:
        log.info("encoding with HF tokenizers: %s", reason)
        return hf
    fast = _tiktoken(spec, threads or cores())
    if hf(_PROBES) != fast(_PROBES):
        log.warning("encoding with HF tokenizers: tiktoken's ids differ from HF's on the probe texts")
        return hf
    return fast


def _not_plain(spec: dict) -> str | None:
    """Why tiktoken might not reproduce this tokenizer's ids; None when it does."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    checks = [
        (model.get("type") == "BPE", "not a BPE model"),
        (spec.get("normalizer") is None, "has a normalizer"),
        (pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"),
         "pre-tokenizer is not ByteLevel(use_regex, no prefix space)"),
        (not model.get("dropout") and not model.get("continuing_subword_prefix")
         and not model.get("end_of_word_suffix") and not model.get("byte_fallback")
         and not model.get("ignore_merges"), "BPE with dropout, affixes, byte fallback or ignore_merges"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    vocab, special = model["vocab"], {t["content"] for t in spec.get("added_tokens", [])}
    alphabet = _byte_level_alphabet()
    if any(ch not in vocab for ch in alphabet):
        return "vocabulary lacks some single bytes"
    if any(ch not in alphabet for t in vocab if t not in special for ch in t):
        return "vocabulary has tokens that are not byte-level"
    merged, last = set(), -1
    for merge in model.get("merges", []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        idx = vocab.get(left + right)
        if idx is None or idx <= last:
            return "merged tokens are not numbered in merge order"
        merged.add(idx)
        last = idx
    if any(len(t) > 1 and idx not in merged for t, idx in vocab.items() if t not in special):
        return "vocabulary has multi-byte tokens that no merge makes"
    return None


def tiktoken_encoding(spec: dict, special: dict[str, int] | None = None):
    """The tiktoken ``Encoding`` of a plain byte-level BPE (``tokenizer.json`` as a dict): its
    tokens as bytes, ranked by id, GPT-2's split pattern; ``special`` tokens only registered (a
    registered one is searched for and skipped as text; with none, tiktoken searches for an empty
    pattern at every character)."""
    import tiktoken  # tiktoken: only the tokenize tasks need it; DAG parse must not pay

    added = {t["content"] for t in spec.get("added_tokens", [])}
    to_byte = _byte_level_alphabet()
    ranks = {bytes(to_byte[ch] for ch in token): idx
             for token, idx in spec["model"]["vocab"].items() if token not in added}
    return tiktoken.Encoding("taxiway-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special or {})


def cores() -> int:
    """Cores this process may run on (its affinity: a cpuset, ``taskset``), not the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _hf(tok, threads: int | None) -> Encoder:
    """HF's encoder. ``encode_batch_fast`` spreads a batch over HF's own pool of every core, which
    no argument bounds; on one thread documents are encoded one by one in the caller's thread
    (``encode`` also builds offsets: slower per document, but this is only the fallback engine)."""
    if threads == 1:
        def hf_arrays(texts: list[str]) -> list[np.ndarray]:
            return [np.asarray(tok.encode(t, add_special_tokens=False).ids, np.uint32) for t in texts]
    else:
        def hf_arrays(texts: list[str]) -> list[np.ndarray]:
            return [np.asarray(e.ids, np.uint32) for e in tok.encode_batch_fast(texts, add_special_tokens=False)]

    return Encoder("hf_tokenizers", hf_arrays)


def _tiktoken(spec: dict, threads: int) -> Encoder:
    """tiktoken on a pool of ``threads`` threads, each with an ``Encoding`` of its own.

    One ``Encoding`` shared by threads does not scale: its per-thread regex copies still share
    the compiled pattern's inner regex caches (the lookahead makes it a fancy-regex program whose
    delegates are shared), and threads contending for them rebuild caches instead of encoding.
    On this project's 2-core machine, two threads on one ``Encoding`` took as long as one with
    twice its CPU; two with one each took 0.55x the time (``bench/tokenize_bench.py``)."""
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    local = threading.local()

    def encode(text: str) -> np.ndarray:
        one = getattr(local, "encode", None)
        if one is None:  # built once per pool thread: under 10 ms for an 8192-token vocabulary
            # never allowed, so special-token text is encoded as text (encode_ordinary's ids, tested)
            one = local.encode = partial(tiktoken_encoding(spec, added).encode_to_numpy,
                                         allowed_special=frozenset(), disallowed_special=())
        return one(text)

    # one pool for the encoder's life (encode_ordinary_batch starts one per call), shared by
    # concurrent callers, so documents of the next batch queue behind this one's
    pool = ThreadPoolExecutor(threads, thread_name_prefix="taxiway-tiktoken")

    def tiktoken_arrays(texts: list[str]) -> list[np.ndarray]:
        return list(pool.map(encode, texts))

    return Encoder("tiktoken_bpe", tiktoken_arrays)


def _byte_level_alphabet() -> dict[str, int]:
    """HF/GPT-2 byte-level characters back to the bytes they stand for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, printable, strict=True)), 0
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + extra
            extra += 1
    return {chr(c): b for b, c in chars.items()}
