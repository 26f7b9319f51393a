"""Vectorized MinHash signatures (numpy) for whole batches of documents at once.

Shingles are n-grams of words, where a word is a run of ``[A-Za-z0-9_]`` or non-ASCII bytes of
the UTF-8 text, ASCII-lower-cased. Nothing is built per shingle or per word in Python: the
batch's bytes become one uint8 array; word boundaries come from byte-class comparisons; a
word's hash mixes (MurmurHash3 finaliser) its first and last 8 bytes, gathered through an
unaligned stride-1 uint64 view, with its length — exact for words up to 16 bytes; n consecutive
word hashes combine into a shingle hash (shingles never cross a document boundary). The
permutations are datasketch 2.0's "affine32" scheme (``a_k * h + b_k`` in uint32, wraparound as the modulus, ``a_k`` odd so each is a bijection),
computed as one (num_perm, shingles) matrix with per-document minima from ``np.minimum.reduceat``
along the contiguous axis. Batches are independent: ``overlap`` signs them in parallel worker
processes.

LSH bands/rows are derived from the target threshold (after datatrove and datasketch): the
(b, r) with b*r <= num_perm minimising false-positive weight 0.05 and false-negative weight 0.95
of the S-curve. Recall is what matters here, because every candidate is then confirmed by its
exact shingle Jaccard; for threshold 0.8 and 128 permutations this gives b=16, r=8, whose
candidate probability is 0.947 at J=0.8, 0.994 at J=0.85 and 0.24 at J=0.6.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

import numpy as np

T = TypeVar("T")
_U64 = np.uint64
_MIX1, _MIX2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_ROLL = _U64(0x9E3779B97F4A7C15)
_CHUNK_SHINGLES = 1 << 14      # columns per permutation matrix: 128 x 16384 x 4 B = 8 MiB, cache-sized
BATCH_BYTES = 1 << 18          # text per numpy batch: bounds memory, and shares out evenly among workers
FN_WEIGHT, FP_WEIGHT = 0.95, 0.05
_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


def _lower(arr: np.ndarray) -> np.ndarray:
    """ASCII-lower-cased bytes. Comparisons and adds (SIMD) instead of a 256-entry lookup
    table, which numpy runs as a gather (one indexed load per byte instead of SIMD compares); ``- 65`` wraps, so one
    comparison tests the range."""
    return arr + ((arr - 65) < 26) * np.uint8(32)


def _word_bytes(lower: np.ndarray) -> np.ndarray:
    """Which lower-cased bytes belong to words: ``[a-z0-9_]`` and every non-ASCII byte."""
    return ((lower - 97) < 26) | ((lower - 48) < 10) | (lower >= 128) | (lower == 95)


def _fmix64(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> _U64(33))
    h = h * _MIX1
    h = h ^ (h >> _U64(33))
    h = h * _MIX2
    return h ^ (h >> _U64(33))


def batch_shingles(texts: list[bytes], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(shingle hashes uint32, owning document index int64), grouped by document in order.

    A document with fewer than ``n`` words yields one shingle of all its words; one with no
    words yields none.
    """
    if not texts:
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    # every document is preceded by a NUL (not a word byte) and 8 NULs pad the end
    arr = _lower(np.frombuffer(b"\x00" + b"\x00".join(texts) + b"\x00" * 8, dtype=np.uint8))
    word = _word_bytes(arr)
    edges = np.flatnonzero(word[1:] != word[:-1]) + 1  # one boolean compare pass instead of np.diff on int8 plus a compare
    if not len(edges):
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    starts, ends = edges[0::2], edges[1::2]  # word starts and ends alternate; the padding ends the last
    lengths = ends - starts
    # the 8 bytes at every offset, as one unaligned little-endian uint64 view (stride 1 byte)
    at = np.ndarray(shape=(len(arr) - 7,), dtype="<u8", buffer=arr, strides=(1,))
    mask = _MASK[np.minimum(lengths, 8)]
    head = at[starts] & mask
    tail = at[np.maximum(ends - 8, starts)] & mask
    with np.errstate(over="ignore"):
        words = _fmix64(head * _MIX1 + tail * _ROLL + lengths.astype(np.uint64))
    doc_starts = np.cumsum([1] + [len(t) + 1 for t in texts[:-1]])
    word_doc = np.searchsorted(doc_starts, starts, side="right") - 1
    count = len(words)
    width = max(0, count - n + 1)
    with np.errstate(over="ignore"):
        h = np.zeros(width, dtype=np.uint64)
        for k in range(n):
            h = h * _ROLL + words[k:k + width]
    valid = word_doc[:width] == word_doc[n - 1:n - 1 + width]
    sh, sh_doc = h[valid], word_doc[:width][valid]
    per_doc = np.bincount(word_doc, minlength=len(texts))
    short = np.flatnonzero((per_doc > 0) & (per_doc < n))
    if len(short):
        first = np.searchsorted(word_doc, short)
        extra = np.empty(len(short), dtype=np.uint64)
        with np.errstate(over="ignore"):
            for i, (d, f) in enumerate(zip(short, first, strict=True)):
                acc = _U64(0)
                for w in words[f:f + per_doc[d]]:
                    acc = acc * _ROLL + w
                extra[i] = acc
        sh, sh_doc = np.concatenate([sh, extra]), np.concatenate([sh_doc, short])
        order = np.argsort(sh_doc, kind="stable")
        sh, sh_doc = sh[order], sh_doc[order]
    return (_fmix64(sh) >> _U64(32)).astype(np.uint32), sh_doc


def size_groups(items: list[T], size: Callable[[T], int], limit: int) -> list[list[T]]:
    """Consecutive groups of about ``limit`` in total size: big enough for numpy, small enough
    to bound memory and to share out among workers."""
    out, current, total = [], [], 0
    for item in items:
        current.append(item)
        total += size(item)
        if total >= limit:
            out.append(current)
            current, total = [], 0
    return out + ([current] if current else [])


def shingle_sets(texts: list[bytes], n: int) -> list[np.ndarray]:
    """Sorted distinct shingle hashes of each document (for exact Jaccard), by batches of
    ``BATCH_BYTES``: one sort of (document, hash) keys per batch instead of a ``np.unique`` per
    document."""
    return [s for group in size_groups(texts, len, BATCH_BYTES) for s in _shingle_sets(group, n)]


def _shingle_sets(texts: list[bytes], n: int) -> list[np.ndarray]:
    sh, doc = batch_shingles(texts, n)
    keys = np.sort((doc.astype(np.uint64) << _U64(32)) | sh)
    keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))] if len(keys) else keys
    bounds = np.searchsorted(keys, np.arange(1, len(texts), dtype=np.uint64) << _U64(32))
    return [part.astype(np.uint32) for part in np.split(keys, bounds)]


@lru_cache(maxsize=16)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """datasketch's ``_optimal_param`` (same weights, same (b, r) order, same tie-break), with
    its ~1400 ``scipy.integrate.quad`` calls replaced by one Gauss-Legendre rule over every (b, r)
    at once: ``1 - (1 - s^r)^b`` is a polynomial of degree b*r <= num_perm, which num_perm/2 + 1
    nodes integrate exactly. The search runs once per check, before any batch is signed, so its
    time is serial time for every worker count."""
    b = np.concatenate([np.full(num_perm // k, k) for k in range(1, num_perm + 1)])
    r = np.concatenate([np.arange(1, num_perm // k + 1) for k in range(1, num_perm + 1)])
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 1)

    def candidate(lo: float, hi: float) -> np.ndarray:
        """P(candidate | Jaccard s) at the rule's nodes in [lo, hi], one row per (b, r)."""
        s = (hi - lo) / 2 * nodes + (hi + lo) / 2
        return 1 - (1 - s[None, :] ** r[:, None]) ** b[:, None]

    # elementwise sums rather than a matrix product: BLAS would start threads that keep spinning
    false_pos = (candidate(0.0, threshold) * weights).sum(axis=1) * threshold / 2
    false_neg = ((1 - candidate(threshold, 1.0)) * weights).sum(axis=1) * (1 - threshold) / 2
    best = int(np.argmin(false_pos * FP_WEIGHT + false_neg * FN_WEIGHT))
    return int(b[best]), int(r[best])


class MinHasher:
    def __init__(self, num_perm: int, shingle_words: int, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm, self.shingle_words = num_perm, shingle_words
        self.a = (rng.integers(0, 2**32, num_perm, dtype=np.uint64) | _U64(1)).astype(np.uint32)[:, None]
        self.b = rng.integers(0, 2**32, num_perm, dtype=np.uint64).astype(np.uint32)[:, None]

    def signatures(self, texts: list[bytes]) -> np.ndarray:
        """(len(texts), num_perm) uint32 minima; documents without shingles get all-max rows."""
        out = np.full((len(texts), self.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
        sh, doc = batch_shingles(texts, self.shingle_words)
        buf = _buffer(self.num_perm)
        for lo in range(0, len(sh), _CHUNK_SHINGLES):
            part, part_doc = sh[lo:lo + _CHUNK_SHINGLES], doc[lo:lo + _CHUNK_SHINGLES]
            seg = np.flatnonzero(np.concatenate(([True], part_doc[1:] != part_doc[:-1])))
            values = buf[:, :len(part)]
            np.multiply(self.a, part[None, :], out=values)
            values += self.b
            ids = part_doc[seg]
            out[ids] = np.minimum(out[ids], np.minimum.reduceat(values, seg, axis=1).T)
        return out


_LOCAL = threading.local()


def _buffer(num_perm: int) -> np.ndarray:
    """One permutation matrix per thread (so per worker process), reused across batches and
    hashers: allocating 8 MiB per chunk means fresh pages (page faults, unmaps) every time."""
    buf = getattr(_LOCAL, "buf", None)
    if buf is None or buf.shape[0] != num_perm:
        buf = _LOCAL.buf = np.empty((num_perm, _CHUNK_SHINGLES), dtype=np.uint32)
    return buf


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted distinct hash arrays."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
