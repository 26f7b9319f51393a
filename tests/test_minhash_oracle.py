"""Oracle: the vectorized shingling and MinHash signatures (``pipelines.preflight.minhash``) equal a
plain Python implementation of what the module documents, word by word and shingle by shingle.

The reference spells the documented scheme out with Python integers (mod 2**64 / 2**32): words are
runs of ``[a-z0-9_]`` or non-ASCII bytes of the ASCII-lower-cased UTF-8 text; a word's hash is the
MurmurHash3 finaliser of ``head * MIX1 + tail * ROLL + length`` (head/tail = its first/last
``min(length, 8)`` bytes, little-endian); ``n`` consecutive word hashes roll into a shingle
(``h = h * ROLL + w``), a document with 1..n-1 words is one shingle of all of them, and a shingle is
the finaliser's top 32 bits; permutation k is ``(a_k * s + b_k) mod 2**32`` with the module's
seeded ``a`` (odd) and ``b``. Any vectorization bug (a word cut at a batch or document boundary, a
wrong mask, a shingle crossing documents, a chunk seam in the permutation matrix) shows up as a
differing signature.
"""

from __future__ import annotations

import random
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipelines.demo_data import stdlib_sources
from pipelines.preflight.minhash import MinHasher, batch_shingles, jaccard, shingle_sets

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
MIX1, MIX2, ROLL = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x9E3779B97F4A7C15
WORD = re.compile(rb"[a-z0-9_\x80-\xff]+")
N = 5


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * MIX1) & M64
    h ^= h >> 33
    h = (h * MIX2) & M64
    return h ^ (h >> 33)


def word_hash(word: bytes) -> int:
    k = min(len(word), 8)
    head = int.from_bytes(word[:k], "little")
    tail = int.from_bytes(word[len(word) - k:], "little")
    return fmix64((head * MIX1 + tail * ROLL + len(word)) & M64)


def ref_shingles(text: bytes, n: int = N) -> list[int]:
    """Every shingle of a document, in order, with repeats."""
    words = [word_hash(w) for w in WORD.findall(text.lower())]  # bytes.lower() is ASCII-only
    spans = [words[i:i + n] for i in range(len(words) - n + 1)] if len(words) >= n else [words] if words else []
    out = []
    for span in spans:
        h = 0
        for w in span:
            h = (h * ROLL + w) & M64
        out.append(fmix64(h) >> 32)
    return out


def ref_signature(text: bytes, a: list[int], b: list[int], n: int = N) -> list[int]:
    shingles = set(ref_shingles(text, n))
    if not shingles:
        return [M32] * len(a)
    return [min((ak * s + bk) & M32 for s in shingles) for ak, bk in zip(a, b, strict=True)]


def check(texts: list[bytes], num_perm: int = 16, n: int = N) -> None:
    hasher = MinHasher(num_perm, n)
    a, b = [int(x) for x in hasher.a.ravel()], [int(x) for x in hasher.b.ravel()]
    sh, doc = batch_shingles(texts, n)
    assert np.all(np.diff(doc) >= 0), "shingles must come grouped by document, in order"
    for i, text in enumerate(texts):
        assert sh[doc == i].tolist() == ref_shingles(text, n), f"document {i}: shingles differ"
    sigs = hasher.signatures(texts)
    assert sigs.shape == (len(texts), num_perm) and sigs.dtype == np.uint32
    for i, text in enumerate(texts):
        assert sigs[i].tolist() == ref_signature(text, a, b, n), f"document {i}: signature differs"
    for text, got in zip(texts, shingle_sets(texts, n), strict=True):
        assert got.tolist() == sorted(set(ref_shingles(text, n)))


def test_the_module_documents_the_permutations_it_uses():
    """``a`` odd (a bijection mod 2**32) and both drawn from the seeded generator as documented."""
    hasher = MinHasher(128, N, seed=1)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2**32, 128, dtype=np.uint64) | np.uint64(1)
    b = rng.integers(0, 2**32, 128, dtype=np.uint64)
    assert hasher.a.ravel().tolist() == a.tolist() and hasher.b.ravel().tolist() == b.tolist()
    assert all(x % 2 == 1 for x in hasher.a.ravel().tolist())


EDGE_CASES = [
    b"", b"   \n\n\t  ", b"one", b"two words", b"exactly five words here now", b"six words are one more than five",
    b"\n\nempty\n\nlines\n\n\n\nbetween\n\nevery\n\nword\n\n",
    "naïve café — “quotes” 中文字符 🙂🙂 e\u0301 ÀÉÎ ünïcode Straße".encode(),
    b"A" * 7 + b" " + b"B" * 8 + b" " + b"C" * 9 + b" " + b"D" * 16 + b" " + b"E" * 17 + b" " + b"F" * 300,
    b"supercalifragilisticexpialidocious_and_then_some antidisestablishmentarianism_x" * 3,
    b"MiXeD CaSe WoRdS mixed case words MIXED CASE WORDS", b"___ 0x1F 1e-5 3.14 a_b_c __init__ self.x",
    b"punctuation!!! only??? ... ;;; --- +++", b"!!!", b"\x80\xff\xfe binary-ish \xc3",
    "\u00a0non\u2003breaking\u2009spaces\u3000ideographic".encode(),
]


def test_edge_cases_alone_and_in_one_batch():
    for text in EDGE_CASES:
        check([text])
    check(EDGE_CASES)
    check(EDGE_CASES[::-1], n=3)


_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=120)
_WORDY = st.lists(st.sampled_from(["a", "Z", "9", "_", " ", "  ", "\n", "\n\n", "\t", "é", "中", "🙂", "-", ".",
                                   "word", "WORD", "x" * 15, "y" * 16, "z" * 17, "q" * 40, "\u0301", "\u00a0"]),
                  max_size=80).map("".join)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(docs=st.lists(_TEXT | _WORDY, max_size=12), n=st.integers(1, 6))
def test_random_documents(docs: list[str], n: int):
    check([d.encode() for d in docs], num_perm=8, n=n)


def test_random_bytes_with_long_words():
    """Long words that share both ends and their length collide by design; distinct random ones do not."""
    rng = random.Random(0)
    alphabet = "abcXYZ019_ é中🙂\n\n-"
    docs = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400))) for _ in range(60)]
    docs += [" ".join("".join(rng.choice("ab") for _ in range(rng.randrange(1, 40))) for _ in range(50))
             for _ in range(20)]
    check([d.encode() for d in docs], num_perm=32)


@pytest.fixture(scope="module")
def real_documents() -> list[bytes]:
    """Sources the demo generator (``pipelines.demo_data``) takes documents from, a seeded sample
    small enough for the pure-Python reference, large enough to span several permutation chunks."""
    files = stdlib_sources()
    sample = random.Random(0).sample(files, 40)
    return [p.read_bytes() for p in sorted(sample, key=lambda p: p.stat().st_size)[:36]]


def test_real_documents(real_documents: list[bytes]):
    total = sum(len(ref_shingles(t)) for t in real_documents)
    assert total > 1 << 14, "the batch must cross the permutation matrix's chunk seam"
    check(real_documents, num_perm=16)


def test_exact_jaccard_matches_python_sets(real_documents: list[bytes]):
    sets = shingle_sets(real_documents[:12], N)
    ref = [set(ref_shingles(t)) for t in real_documents[:12]]
    for i in range(len(ref)):
        for j in range(len(ref)):
            union = ref[i] | ref[j]
            expected = len(ref[i] & ref[j]) / len(union) if union else 1.0
            assert jaccard(sets[i], sets[j]) == pytest.approx(expected, abs=1e-12)
