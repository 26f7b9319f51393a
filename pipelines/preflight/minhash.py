"""Vectorized MinHash signatures (numpy) for whole batches of documents at once.

Shingles are n-grams of words, where a word is a run of ``[A-Za-z0-9_]`` or non-ASCII bytes of
the UTF-8 text, ASCII-lower-cased. Nothing is built per shingle or per word in Python: the
batch's bytes become one uint8 array; word boundaries come from a byte-class table; a word's
hash mixes (MurmurHash3 finaliser) its first and last 8 bytes, gathered as uint64 through a
strided view, with its length — exact for words up to 16 bytes; n consecutive word hashes combine into a shingle hash (shingles never
cross a document boundary). The permutations are datasketch 2.0's "affine32" scheme
(``a_k * h + b_k`` in uint32, wraparound as the modulus, ``a_k`` odd so each is a bijection),
computed as one (num_perm, shingles) matrix with per-document minima from ``np.minimum.reduceat``
along the contiguous axis. Every heavy step is a numpy call that releases the GIL, so batches
run in parallel threads.

LSH bands/rows are derived from the target threshold (after datatrove and datasketch): the
(b, r) with b*r <= num_perm minimising false-positive weight 0.05 and false-negative weight 0.95
of the S-curve. Recall is what matters here, because every candidate is then confirmed by its
exact shingle Jaccard; for threshold 0.8 and 128 permutations this gives b=16, r=8, whose
candidate probability is 0.947 at J=0.8, 0.994 at J=0.85 and 0.24 at J=0.6.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np

_U64 = np.uint64
_MIX1, _MIX2 = _U64(0xFF51AFD7ED558CCD), _U64(0xC4CEB9FE1A85EC53)
_ROLL = _U64(0x9E3779B97F4A7C15)
_CHUNK_SHINGLES = 1 << 14      # columns per permutation matrix: 128 x 16384 x 4 B = 8 MiB, cache-sized
FN_WEIGHT, FP_WEIGHT = 0.95, 0.05

_WORD_BYTE = np.zeros(256, dtype=bool)
for _lo, _hi in ((ord("a"), ord("z")), (ord("A"), ord("Z")), (ord("0"), ord("9")), (0x80, 0xFF)):
    _WORD_BYTE[_lo:_hi + 1] = True
_WORD_BYTE[ord("_")] = True
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[ord("A"):ord("Z") + 1] += 32
_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], dtype=np.uint64)


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
    arr = _LOWER[np.frombuffer(b"\x00".join(texts) + b"\x00" * 8, dtype=np.uint8)]
    edges = np.diff(_WORD_BYTE[arr].view(np.int8), prepend=np.int8(0))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    if not len(starts):
        return np.empty(0, np.uint32), np.empty(0, np.int64)
    lengths = ends - starts
    windows = np.lib.stride_tricks.as_strided(arr, shape=(len(arr) - 7, 8), strides=(1, 1))
    head = windows[starts].view("<u8").ravel() & _MASK[np.minimum(lengths, 8)]
    tail = windows[np.maximum(ends - 8, starts)].view("<u8").ravel() & _MASK[np.minimum(lengths, 8)]
    with np.errstate(over="ignore"):
        words = _fmix64(head * _MIX1 + tail * _ROLL + lengths.astype(np.uint64))
    doc_starts = np.zeros(len(texts), dtype=np.int64)
    np.cumsum([len(t) + 1 for t in texts[:-1]], out=doc_starts[1:])
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


def shingle_set(text: str, n: int) -> np.ndarray:
    """Sorted distinct shingle hashes of one document (for exact Jaccard)."""
    return np.unique(batch_shingles([text.encode()], n)[0])


@lru_cache(maxsize=16)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    from datasketch.lsh import _optimal_param

    return _optimal_param(threshold, num_perm, FP_WEIGHT, FN_WEIGHT)


class MinHasher:
    def __init__(self, num_perm: int, shingle_words: int, seed: int = 1) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm, self.shingle_words = num_perm, shingle_words
        self.a = (rng.integers(0, 2**32, num_perm, dtype=np.uint64) | _U64(1)).astype(np.uint32)[:, None]
        self.b = rng.integers(0, 2**32, num_perm, dtype=np.uint64).astype(np.uint32)[:, None]
        self._local = threading.local()

    def signatures(self, texts: list[bytes]) -> np.ndarray:
        """(len(texts), num_perm) uint32 minima; documents without shingles get all-max rows."""
        out = np.full((len(texts), self.num_perm), np.iinfo(np.uint32).max, dtype=np.uint32)
        sh, doc = batch_shingles(texts, self.shingle_words)
        buf = self._buffer()
        for lo in range(0, len(sh), _CHUNK_SHINGLES):
            part, part_doc = sh[lo:lo + _CHUNK_SHINGLES], doc[lo:lo + _CHUNK_SHINGLES]
            seg = np.flatnonzero(np.diff(part_doc, prepend=-1))
            values = buf[:, :len(part)]
            np.multiply(self.a, part[None, :], out=values)
            values += self.b
            ids = part_doc[seg]
            out[ids] = np.minimum(out[ids], np.minimum.reduceat(values, seg, axis=1).T)
        return out

    def _buffer(self) -> np.ndarray:
        """One permutation matrix per thread, reused: allocating 8 MiB per chunk means fresh
        pages (page faults, unmaps) every time, which serializes threads in the kernel."""
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = np.empty((self.num_perm, _CHUNK_SHINGLES), dtype=np.uint32)
        return buf


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard of two sorted distinct hash arrays."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)
